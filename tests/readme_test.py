"""README.md keeps its promises: one screenful of purpose, own-text pretraining in its first two
screens, the two commands CI itself runs (.ci/run installs as README says and runs README's test
command), links that resolve on GitHub, and the suite's test count. Its commands run in
tests/docs_test.py, with the docs site's (tests/runnable_blocks.py)."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

import runnable_blocks as rb
from conftest import COLLECTED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
INSTALL = "pip install -e ."
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -q tests'


def _readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_readme_is_one_screenful_of_purpose():
    text = _readme()
    lines = len(text.splitlines())
    assert lines <= 200 and len(text) <= 15_000, (lines, len(text))
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    order = ["Install", "The two commands", "Pretrain on your own text", "Recipes", "License"]
    found = [next(i for i, h in enumerate(headings) if h.startswith(f"## {o}")) for o in order]
    assert found == sorted(found), headings
    own_text = text.splitlines().index("## Pretrain on your own text")
    assert own_text < 100, f"own-text pretraining starts at line {own_text}: past two screens"


def test_ci_installs_as_readme_says_and_runs_its_test_command():
    """.ci/run runs the commands README gives a newcomer (pip's -q aside), and README's first
    command is the default job, runnable as written."""
    blocks = rb.page_blocks("README.md", _readme())
    texts = [b.text for b in blocks]
    assert f"{INSTALL} && python train.py\n" in texts
    assert f"{TEST_COMMAND}\n" in texts
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert 'python3 -m pip install -q -e ".[test]"' in ci
    assert re.search(r"^python3 -m pytest -q tests\b", ci, re.MULTILINE), ci
    assert "mkdocs build --strict" in ci


def heading_anchors(markdown: str) -> set:
    """The anchors GitHub gives a markdown file's headings: lower case, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces to ``-``; a repeated one gets
    ``-1``, ``-2``, ...; ``#`` lines inside fenced code blocks are not headings. (The docs site
    uses the same rule: mkdocs.yml's slugify.)"""
    anchors, seen, fenced = set(), collections.Counter(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"#{1,6} (.+)", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def broken_links(page: str) -> list[str]:
    """The relative links of a markdown file at the repository root whose file or heading is
    missing (the docs site's own links are checked by its strict build)."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.join(ROOT, os.path.dirname(page), path) if path else os.path.join(ROOT, page)
        if not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md"):
            with open(full, encoding="utf-8") as f:
                if anchor not in heading_anchors(f.read()):
                    broken.append(target)
    return broken


def test_links_of_readme_and_contributing_resolve():
    assert len(re.findall(r"\]\((?!https?:)", _readme())) >= 20  # the links are there to check
    for page in ("README.md", "CONTRIBUTING.md"):
        assert not broken_links(page), (page, broken_links(page))
    assert heading_anchors("# A: b's (c)\n## A: b's (c)\n```\n# no\n```\n") == {
        "a-bs-c",
        "a-bs-c-1",
    }


TESTS = os.path.join(ROOT, "tests")


def collected_tests(config) -> int:
    """The suite's test count: this session's where it collected all of tests/ (README's
    command, CI), else a collect-only run of tests/ (~20 s of CPU)."""
    if config.args and all(os.path.abspath(a).rstrip("/") == TESTS for a in config.args):
        return config.stash[COLLECTED]
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", TESTS]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = re.search(r"^(\d+) tests? collected", out.stdout, re.MULTILINE)
    assert found, out.stdout[-2000:] + out.stderr[-2000:]
    return int(found.group(1))


def test_the_test_count_readme_states_is_the_suites(request):
    """README's "N tests" (from the latest CI run, results: tests) within 5% of the tests the
    suite holds now: a figure left behind by new tests fails here."""
    stated = re.search(r"([\d,]+) tests on two\s+pytest-xdist workers", _readme())
    assert stated, "README's test command no longer states the suite's test count"
    stated, actual = int(stated.group(1).replace(",", "")), collected_tests(request.config)
    assert abs(stated - actual) <= 0.05 * actual, (
        f"README says {stated} tests; the suite holds {actual}: update README's count and "
        "CI time from the latest CI run (docs/results/tests.md)"
    )


def test_every_recipe_is_in_readme_s_table_and_the_recipes_page():
    recipes = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "configs")) if n.endswith(".py"))
    with open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8") as f:
        page = f.read()
    readme_rows = "".join(line for line in _readme().splitlines() if line.startswith("| `"))
    page_rows = "".join(line for line in page.splitlines() if line.startswith("| `"))
    missing = [r for r in recipes if f"`{r}`" not in readme_rows or f"`{r}`" not in page_rows]
    assert len(recipes) >= 28 and not missing, f"recipes missing from a table: {missing}"


def test_contributing_s_layout_names_every_part_of_the_package():
    with open(os.path.join(ROOT, "CONTRIBUTING.md"), encoding="utf-8") as f:
        text = f.read()
    layout = text[text.index("## Layout") : text.index("## Documentation")]
    package = os.path.join(ROOT, "bertjax")
    parts = [
        n + "/"
        for n in os.listdir(package)
        if os.path.isfile(os.path.join(package, n, "__init__.py"))
    ]
    parts += [n for n in os.listdir(package) if n.endswith(".py") and n != "__init__.py"]
    assert not [p for p in parts if p not in layout], [p for p in parts if p not in layout]
