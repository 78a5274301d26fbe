"""Every command of README.md and of the docs site (docs/) runs as written, or says why it cannot
(tests/runnable_blocks.py: the markers, and what the test adds to a command to shrink it); the
pages' own data (a text corpus, a task, a GLUE directory) are fixtures written here."""

import json
import os

import pytest
import runnable_blocks as rb
from glue_fixtures import SIGNAL, write_glue_dir

BLOCKS = rb.all_blocks()
RUN = [b for b in BLOCKS if b.runnable]


def test_every_command_block_runs_or_says_why_not():
    pages = rb.pages()
    assert "README.md" in pages and "docs/data.md" in pages and len(pages) >= 18
    for block in BLOCKS:
        assert block.language, f"{block.name}: a fenced block names its language (text for output)"
        if block.language in ("console", "shell", "zsh"):
            raise AssertionError(f"{block.name}: write shell blocks as bash")
        if block.language in rb.COMMANDS:
            assert block.runnable or block.reason, (
                f"{block.name}: mark it <!-- runnable --> or <!-- not-run: why it cannot run -->"
            )
        else:
            assert not block.runnable and not block.reason, f"{block.name}: not a command"
        if block.runnable:  # only what this test knows how to run
            assert "pytest" not in block.text and "gcloud" not in block.text, block.name
            assert "srun" not in block.text and "git clone" not in block.text, block.name


def test_the_faces_the_pages_promise_are_run():
    runnable = "".join(b.text for b in RUN)
    for needle in (
        "pip install -e . && python train.py\n",  # README's first command, as written
        "--config.data.corpus='my_corpus/*.txt'",  # own text
        "--config=configs/finetune_glue.py",
        "--config=configs/electra_tiny.py",
        "--config=configs/modernbert_tiny.py",
        "--config=configs/clm_mlm_tiny.py",
        "--config=configs/diffusion_tiny.py",
        "--config=configs/embed_tiny.py",
        "python -m bertjax.diffusion",
        "python -m bertjax.glue",
        "python -m bertjax.predict",
        "python -m bertjax.embed",
        "python -m bertjax.compile",
        "python -m bertjax.data.prepare",
        "--task=fill_mask",
        "convert.from_hf(",
        "convert.to_hf(",
        "step.jit_steps(",
        "make_pipeline(",
        "--multihost --coordinator_address=localhost:",
    ):
        assert needle in runnable, f"no runnable block has {needle!r}"


def test_markers_and_shrinking():
    text = "# T\n<!-- runnable -->\n\n```bash\nls\n```\n\n"
    text += "<!-- not-run: a TPU -->\n```python\nx\n```\n"
    text += "<!-- runnable: exit 2 -->\n```bash\nfalse\n```\n```text\nout\n```\n"
    blocks = rb.page_blocks("p.md", text)
    got = [(b.language, b.runnable, b.reason, b.status, b.line, b.heading) for b in blocks]
    assert got == [
        ("bash", True, "", 0, 5, "T"),  # the line of its first command
        ("python", False, "a TPU", 0, 10, "T"),
        ("bash", True, "", 2, 14, "T"),
        ("text", False, "", 0, 17, "T"),
    ]
    shell = 'pip install -e . && python train.py  # go\npython x.py \\\n --p="b c"\n'
    assert rb.shell_commands(shell) == [
        ["pip", "install", "-e", "."],
        ["python", "train.py"],
        ["python", "x.py", "--p=b c"],
    ]
    assert rb.shrunken(["pip", "install", "-e", "."], "s") is None
    recipe = rb.shrunken(["python", "train.py", "--config=configs/bert_base.py"], "s")
    assert "--config=configs/bert_base.py:smoke" in recipe
    default = rb.shrunken(["python", "train.py"], "spm")
    assert "--config.num_train_steps=4" in default
    assert "--config.data.tokenizer_model=spm" in default


def _write_corpus(directory: str) -> None:
    """my_corpus/: the built-in corpus as BERT-format text files and as JSON Lines."""
    from bertjax.data.text import corpus

    os.makedirs(directory)
    documents = [sentences for _, sentences in corpus.iter_documents("builtin")][:400]
    for part in range(2):
        with open(os.path.join(directory, f"part-{part}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join("\n".join(d) for d in documents[part::2]) + "\n")
    with open(os.path.join(directory, "docs.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": " ".join(d)}) + "\n" for d in documents)


def _write_task(directory: str) -> None:
    """my_task/: three named classes, a toy signal word in each text."""
    os.makedirs(directory)
    names = ("positive", "negative", "neutral")
    for split, rows in (("train", 48), ("dev", 24)):
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            for i in range(rows):
                label = i % 3
                f.write(f"the {SIGNAL[label][i % 5]} day number {i}\t{names[label]}\n")


@pytest.fixture(scope="module")
def runner(tmp_path_factory, small_spm):
    root = rb.scratch_root(tmp_path_factory.mktemp("docs_root"), write_glue_dir)
    _write_corpus(os.path.join(root, "my_corpus"))
    _write_task(os.path.join(root, "my_task"))
    return rb.Runner(root, small_spm, RUN)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(RUN)), ids=[b.name for b in RUN])
def test_block_runs(runner, index):
    block = runner.blocks[index]
    for command, result in runner.run_through(index):
        shown = " ".join(command[1:])
        assert result.returncode == block.status, f"{block.page} line {block.line}: {shown}\n" + (
            result.stdout[-2000:] + result.stderr[-3000:]
        )
        if block.status:  # a refusal: one line naming what is wrong, no traceback
            assert result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr
            assert "Traceback" not in result.stderr
        elif command[1] == "train.py" and "--process_id=1" not in command:  # process 0 prints it
            summary = json.loads(result.stdout[result.stdout.index("{") :])
            assert summary["step"] > 0, shown
