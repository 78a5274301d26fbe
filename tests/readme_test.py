"""README.md's commands run as written: every fenced block marked ``<!-- runnable -->`` runs,
in README order, one subprocess per command, from a copy of the repository root (symlinks to
its files, so the README's relative paths, ``workdir/...`` and ``glue_data``, land in a fresh
directory instead of a user's own runs).

What the test adds, and only that: ``pip install`` commands are skipped (this environment is the
installed one); every ``python train.py`` and ``python -m bertjax.glue`` command gets
``--config.*`` overrides appended that shrink it (a few steps of a width-32 model on the
session's 400-piece tokenizer, one GLUE task); ``glue_data`` is a fixture GLUE directory
(tests/glue_fixtures.py). Python blocks are complete programs and run unchanged. Blocks that
chain (fine-tuning and GLUE from the default job's workdir) share the copy's ``workdir/``.
A command ending in ``&`` runs in the background until the block's ``wait`` (the processes of
one multi-process run); its ``--coordinator_address=localhost:PORT`` gets a free port instead,
since other test runs may share the machine.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import COLLECTED
from glue_fixtures import write_glue_dir
from helpers import free_port, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MARKER = "<!-- runnable -->"
# Names in the repository root the README's commands write or read as their own data.
OWN_DATA = ("workdir", "glue_data", "hf_bert", "exported")

STEPS = 4
RUN_SHRINK = (  # every train.py run and GLUE run: a few small steps, no progress bar
    f"--config.num_train_steps={STEPS}",
    "--config.batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions=5",
    "--config.optim.warmup_steps=1",
    "--config.log_every=2",
    f"--config.eval_every={STEPS}",
    "--config.eval_batches=1",
    "--config.checkpoint_every=0",
    "--config.progress_bar=False",
    "--config.peak_flops_per_device=1e12",  # no CPU peak measurement at start
)
NEW_MODEL_SHRINK = (  # a run that builds its own model (no init_from): width 32, 2 layers
    "--config.model.hidden_size=32",
    "--config.model.num_hidden_layers=2",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=64",
)
GLUE_SHRINK = (  # one task, one learning rate, one seed, one epoch of the fixture's 64 rows
    "--config.glue.tasks=('rte',)",
    "--config.glue.learning_rates=(1e-3,)",
    "--config.glue.seeds=(0,)",
    "--config.glue.epochs=1",
    "--config.glue.batch_size=16",
    "--config.data.max_seq_length=32",
    "--config.progress_bar=False",
    "--config.peak_flops_per_device=1e12",
)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of the README: its language, text, first line number and heading."""

    language: str
    text: str
    line: int
    heading: str
    runnable: bool

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{slug}-L{self.line}"


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block; ``runnable`` when the last non-blank line before it is MARKER."""
    blocks, lines, heading, previous = [], text.splitlines(), "", ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(line[3:].strip(), body, i + 2, heading, previous == MARKER))
            i, previous = end + 1, ""
            continue
        if line.strip():
            previous = line.strip()
        i += 1
    return blocks


def runnable_blocks() -> list[Block]:
    with open(README, encoding="utf-8") as f:
        return [b for b in readme_blocks(f.read()) if b.runnable]


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: ``\\`` continuations joined, comments dropped, ``&&``
    chains split."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1 :]
    return commands


def shrunken(argv: list[str], spm: str) -> list[str] | None:
    """The command the test runs for one README command (None: skipped, an install)."""
    if argv == ["wait"]:
        return argv
    if argv[-1] == "&":  # in the background: shrunk the same way
        return [*shrunken(argv[:-1], spm), "&"]
    if argv[0] == "pip":
        assert argv[1] == "install", argv
        return None
    assert argv[0] == "python", f"a runnable block runs python or pip install, not {argv}"
    argv = [sys.executable, *argv[1:]]
    if argv[1] == "train.py":
        own_model = not any(a.startswith("--config.init_from") for a in argv)
        extra = [*NEW_MODEL_SHRINK, f"--config.data.tokenizer_model={spm}"] if own_model else []
        return [*argv, *RUN_SHRINK, *extra]
    if argv[1:3] == ["-m", "bertjax.glue"]:
        return [*argv, *GLUE_SHRINK]
    return argv


def _env() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(1)  # a user's one CPU device
    env["JAX_PLATFORMS"] = "cpu"
    return env


class ReadmeRunner:
    """Runs the runnable blocks in README order in one copy of the repository root, once each."""

    def __init__(self, root: str, spm: str):
        self.root, self.spm = root, spm
        self.blocks = runnable_blocks()
        self.results: dict[int, list[tuple[list[str], subprocess.CompletedProcess]]] = {}

    def run_through(self, index: int):
        """Runs every block up to ``index`` not yet run (a block may use an earlier one's
        workdir); returns block ``index``'s (command, result) pairs."""
        for i in range(index + 1):
            if i not in self.results:
                self.results[i] = self._run(i, self.blocks[i])
        return self.results[index]

    def _run(self, i: int, block: Block):
        if block.language == "python":
            path = os.path.join(self.root, f"readme_block_{i}.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(block.text)
            commands = [[sys.executable, os.path.basename(path)]]
        else:
            assert block.language in ("bash", "sh"), block.language
            commands = [shrunken(c, self.spm) for c in shell_commands(block.text)]
        out, background, port = [], [], free_port()
        for command in filter(None, commands):
            command = [_free_coordinator(a, port) for a in command]
            if command == ["wait"]:
                out.extend(_finished(c, proc, log) for c, proc, log in background)
                background = []
            elif command[-1] == "&":
                log = os.path.join(self.root, f"readme_block_{i}_{len(background)}")
                with open(f"{log}.out", "w") as out_file, open(f"{log}.err", "w") as err_file:
                    proc = subprocess.Popen(
                        command[:-1], cwd=self.root, env=_env(), stdout=out_file,
                        stderr=err_file, text=True,
                    )  # fmt: skip
                background.append((command[:-1], proc, log))
                continue
            else:
                out.append(
                    (
                        command,
                        subprocess.run(
                            command, cwd=self.root, env=_env(), capture_output=True, text=True,
                            timeout=600,
                        ),
                    )
                )  # fmt: skip
            if any(result.returncode for _, result in out):
                break
        return out


def _free_coordinator(arg: str, port: int) -> str:
    """``--coordinator_address=localhost:PORT`` with a free port instead of the README's."""
    if arg.startswith("--coordinator_address=localhost:"):
        return f"--coordinator_address=localhost:{port}"
    return arg


def _finished(command, proc, log) -> tuple:
    """(command, its CompletedProcess) once a background command ends (its output in files:
    a pipe nobody reads would block it)."""
    try:
        proc.wait(timeout=600)
    finally:
        proc.kill()
    with open(f"{log}.out") as out, open(f"{log}.err") as err:
        return command, subprocess.CompletedProcess(
            command, proc.returncode, out.read(), err.read()
        )


def _scratch_root(directory) -> str:
    """``directory`` holding a symlink to every entry of the repository root but the README's
    own data and hidden files, and a fixture GLUE directory as ``glue_data``."""
    for name in os.listdir(ROOT):
        if name.startswith(".") or name.startswith(OWN_DATA):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(directory, name))
    write_glue_dir(os.path.join(directory, "glue_data"))
    return str(directory)


@pytest.fixture(scope="module")
def runner(tmp_path_factory, small_spm):
    return ReadmeRunner(_scratch_root(tmp_path_factory.mktemp("readme_root")), small_spm)


def test_blocks_to_run_are_marked_and_install_blocks_are_not():
    with open(README, encoding="utf-8") as f:
        blocks = readme_blocks(f.read())
    runnable = "".join(b.text for b in blocks if b.runnable)
    for needle in (
        "python train.py\n",  # the default job, as the first command names it
        "--config=configs/finetune_glue.py",
        "--config=configs/diffusion_tiny.py",
        "python -m bertjax.diffusion",
        "python -m bertjax.glue",
        "python -m bertjax.predict",
        "--task=fill_mask",
        "convert.from_hf(",
        "step.jit_steps(",
        "--multihost --coordinator_address=localhost:",
    ):
        assert needle in runnable, f"no runnable README block has {needle!r}"
    for block in blocks:
        if block.runnable:  # only what this test knows how to run
            assert block.language in ("bash", "sh", "python"), block.name
            assert "pytest" not in block.text and "gcloud" not in block.text, block.name
            assert "srun" not in block.text, block.name


RESULTS = os.path.join(ROOT, "benchmarks", "results.md")


def heading_anchors(markdown: str) -> set:
    """The anchors GitHub gives a markdown file's headings: lower case, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces to ``-``; a repeated one gets
    ``-1``, ``-2``, ...; ``#`` lines inside fenced code blocks are not headings."""
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


def test_links_to_results_sections_resolve():
    """README's links into benchmarks/results.md, and results.md's index, name headings that
    exist (GitHub's anchors); a reworded topic heading fails here, not for a reader."""
    with open(README) as f:
        readme = f.read()
    with open(RESULTS) as f:
        results = f.read()
    anchors = heading_anchors(results)
    cited = re.findall(r"\]\(benchmarks/results\.md#([^)\s]+)\)", readme)
    index = re.findall(r"\]\(#([^)\s]+)\)", results)
    assert len(set(cited)) >= 8 and len(index) >= 10  # the links are there to check
    assert not [a for a in cited if a not in anchors], sorted(anchors)
    assert not [a for a in index if a not in anchors], sorted(anchors)
    assert "benchmarks/results.md`" not in readme  # a citation is a link to its section
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
    """README's "N tests" (from the latest CI run, results.md: Test suite wall time) within 5%
    of the tests the suite holds now: a figure left behind by new tests fails here."""
    with open(README, encoding="utf-8") as f:
        stated = re.search(r"([\d,]+) tests on two\s+pytest-xdist workers", f.read())
    assert stated, "README's test command no longer states the suite's test count"
    stated, actual = int(stated.group(1).replace(",", "")), collected_tests(request.config)
    assert abs(stated - actual) <= 0.05 * actual, (
        f"README says {stated} tests; the suite holds {actual}: update README's count and "
        "CI time from the latest CI run (results.md: Test suite wall time)"
    )


def test_parsing_joins_continuations_drops_comments_and_splits_chains():
    text = 'pip install -e . && python train.py  # go\npython x.py --a=1 \\\n    --p="b c"\n'
    assert shell_commands(text) == [
        ["pip", "install", "-e", "."],
        ["python", "train.py"],
        ["python", "x.py", "--a=1", "--p=b c"],
    ]
    blocks = readme_blocks(f"# T\n{MARKER}\n\n```bash\nls\n```\n\n```python\nx = 1\n```\n")
    assert [(b.language, b.runnable, b.line, b.heading) for b in blocks] == [
        ("bash", True, 5, "T"),
        ("python", False, 9, "T"),
    ]


_BLOCKS = runnable_blocks()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_BLOCKS)), ids=[b.name for b in _BLOCKS])
def test_readme_block_runs(runner, index):
    for command, result in runner.run_through(index):
        shown = " ".join(command[1:])
        assert result.returncode == 0, f"README line {runner.blocks[index].line}: {shown}\n" + (
            result.stdout[-2000:] + result.stderr[-3000:]
        )
        if command[1] == "train.py" and "--process_id=1" not in command:  # process 0 prints it
            summary = json.loads(result.stdout[result.stdout.index("{") :])
            assert summary["step"] == STEPS, shown
