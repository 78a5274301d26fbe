"""The commands of README.md and the docs site (docs/) run as written: how the blocks are found,
marked and run (tests/docs_test.py runs them; tests/readme_test.py checks README's own claims).

Every ``bash``/``sh``/``python`` block of a page is marked on the line before it, either
``<!-- runnable -->`` (the test runs it and wants exit status 0; ``<!-- runnable: exit 2 -->``
for a block that shows a command refusing bad input) or ``<!-- not-run: REASON -->`` (it cannot
run here: a TPU, a bucket, a cluster, hours of training; the reason says which). Blocks of other
languages (``text`` for output, ``yaml``) are not commands.

What the test adds, and only that, to a runnable block: ``pip install`` commands are skipped
(this environment is the installed one); a ``python train.py`` command that names no recipe (the
default job) gets ``--config.*`` overrides that shrink it (a few steps of a width-32 model on the
session's 400-piece tokenizer); one that names ``--config=configs/X.py`` runs that recipe's
``:smoke`` variant (same objective, data plan, optimizer and phases at toy sizes); ``python -m
bertjax.glue`` runs one GLUE task of the fixture directory ``glue_data`` (tests/glue_fixtures.py).
Python blocks are complete programs and run unchanged. Every block runs in one copy of the
repository root (symlinks to its files, so ``workdir/...`` lands in a fresh directory), pages in
order, so a page may use an earlier block's workdir; a command already run there (the default
job, say) is not run again. A command ending in ``&`` runs in the background until the block's
``wait``; its ``--coordinator_address=localhost:PORT`` gets a free port instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys

import warm_python
from helpers import free_port, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNABLE = re.compile(r"<!-- runnable(?:: exit (\d+))? -->")
NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->")
COMMANDS = ("bash", "sh", "python")  # languages whose blocks must be marked
# Names in the repository root the pages' commands write or read as their own data.
OWN_DATA = ("workdir", "glue_data", "hf_bert", "exported", "my_corpus", "my_task")

DEFAULT_JOB_SHRINK = (  # the default job (no --config): a few small steps, no progress bar
    "--config.num_train_steps=4",
    "--config.batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions=5",
    "--config.optim.warmup_steps=1",
    "--config.log_every=2",
    "--config.eval_every=4",
    "--config.eval_batches=1",
    "--config.checkpoint_every=0",
    "--config.model.hidden_size=32",
    "--config.model.num_hidden_layers=2",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=64",
    "--config.model.max_position_embeddings=64",  # as the smoke variants (a distilled student)
    "--config.fast_compile=True",
)
EVERY_RUN = (  # every train.py and GLUE run
    "--config.progress_bar=False",
    "--config.peak_flops_per_device=1e12",  # no CPU peak measurement at start
)
GLUE_SHRINK = (  # one task, one learning rate, one seed, one epoch of the fixture's 64 rows
    "--config.glue.tasks=('rte',)",
    "--config.glue.learning_rates=(1e-3,)",
    "--config.glue.seeds=(0,)",
    "--config.glue.epochs=1",
    "--config.glue.batch_size=16",
    "--config.data.max_seq_length=32",
)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text, first line, heading and marker."""

    page: str  # relative to the repository root
    language: str
    text: str
    line: int
    heading: str
    runnable: bool
    reason: str  # why it does not run ("" for a runnable or unmarked block)
    status: int = 0  # the exit status each of its commands ends with

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{self.page}:{slug}-L{self.line}"


def page_blocks(page: str, text: str) -> list[Block]:
    """Every fenced block of ``text``; marked by the last non-blank line before it."""
    blocks, lines, heading, previous = [], text.splitlines(), "", ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = "\n".join(lines[i + 1 : end]) + "\n"
            reason, runnable = NOT_RUN.fullmatch(previous), RUNNABLE.fullmatch(previous)
            blocks.append(
                Block(page, line[3:].strip(), body, i + 2, heading, runnable is not None,
                      reason.group(1).strip() if reason else "",
                      int(runnable.group(1) or 0) if runnable else 0)
            )  # fmt: skip
            i, previous = end + 1, ""
            continue
        if line.strip():
            previous = line.strip()
        i += 1
    return blocks


def pages() -> list[str]:
    """README.md, CONTRIBUTING.md, then docs/*.md in the site's nav order (pages outside the nav
    after)."""
    docs = os.path.join(ROOT, "docs")
    found = []
    for directory, _, files in os.walk(docs):
        names = [os.path.join(directory, f) for f in files if f.endswith(".md")]
        found += [os.path.relpath(name, ROOT) for name in names]
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)\s*$", f.read(), re.MULTILINE)
    order = {f"docs/{page}": i for i, page in enumerate(nav)}
    found.sort(key=lambda page: (order.get(page, len(order)), page))
    return ["README.md", "CONTRIBUTING.md", *found]


def all_blocks(names=None) -> list[Block]:
    blocks = []
    for page in names or pages():
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            blocks += page_blocks(page, f.read())
    return blocks


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


def _smoke(argv: list[str]) -> list[str]:
    """``--config=configs/X.py`` as ``--config=configs/X.py:smoke``."""
    return [f"{a}:smoke" if a.startswith("--config=configs/") and ":" not in a else a for a in argv]


def shrunken(argv: list[str], spm: str) -> list[str] | None:
    """The command the test runs for one page command (None: skipped, an install)."""
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
        if not any(a.startswith("--config=") for a in argv):
            extra = [*DEFAULT_JOB_SHRINK, *([f"--config.data.tokenizer_model={spm}"] * own_model)]
            return [*argv, *extra, *EVERY_RUN]
        return [*_smoke(argv), *EVERY_RUN]
    if argv[1:3] == ["-m", "bertjax.glue"]:
        return [*argv, *GLUE_SHRINK, *EVERY_RUN]
    if argv[1:3] == ["-m", "bertjax.data.prepare"]:
        return _smoke(argv)
    return argv


def _env() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(1)  # a user's one CPU device
    env["JAX_PLATFORMS"] = "cpu"
    return env


class Runner:
    """Runs runnable blocks in page order in one copy of the repository root, once each; a
    command already run there (after shrinking) is not run again."""

    def __init__(self, root: str, spm: str, blocks: list[Block]):
        self.root, self.spm, self.blocks = root, spm, blocks
        self.results: dict[int, list[tuple[list[str], subprocess.CompletedProcess]]] = {}
        self.done: dict[tuple, subprocess.CompletedProcess] = {}

    def run_through(self, index: int):
        """Runs every block up to ``index`` not yet run (a block may use an earlier one's
        workdir); returns block ``index``'s (command, result) pairs."""
        for i in range(index + 1):
            if i not in self.results:
                self.results[i] = self._run(i, self.blocks[i])
        return self.results[index]

    def _run(self, i: int, block: Block):
        if block.language == "python":
            path = os.path.join(self.root, f"block_{i}.py")
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
                log = os.path.join(self.root, f"block_{i}_{len(background)}")
                with open(f"{log}.out", "w") as out_file, open(f"{log}.err", "w") as err_file:
                    proc = subprocess.Popen(
                        command[:-1], cwd=self.root, env=_env(), stdout=out_file,
                        stderr=err_file, text=True,
                    )  # fmt: skip
                background.append((command[:-1], proc, log))
                continue
            elif _same(command, block) in self.done:
                out.append((command, self.done[_same(command, block)]))
            else:
                result = warm_python.run(command, cwd=self.root, env=_env(), timeout=600)
                self.done[_same(command, block)] = result
                out.append((command, result))
            if any(result.returncode != block.status for _, result in out):
                break
        return out


def _same(command: list[str], block: Block) -> tuple:
    """What makes two commands the same run: the arguments less train.py's default workdir (a
    Python block: its text, since its file name is the block's)."""
    if block.language == "python":
        return ("python", block.text)
    return tuple(a for a in command if a != "--workdir=workdir/bert_tiny")


def _free_coordinator(arg: str, port: int) -> str:
    """``--coordinator_address=localhost:PORT`` with a free port instead of the page's."""
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


def scratch_root(directory, write_glue_dir) -> str:
    """``directory`` holding a symlink to every entry of the repository root but the pages' own
    data and hidden files, and a fixture GLUE directory as ``glue_data``."""
    for name in os.listdir(ROOT):
        if name.startswith(".") or name.startswith(OWN_DATA):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(directory, name))
    write_glue_dir(os.path.join(directory, "glue_data"))
    return str(directory)
