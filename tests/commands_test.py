"""Every command meets bad input the same way (bertjax/cli.py): one line on stderr naming the
flag, or the file and line, exit status 2, no traceback (unless --verbosity=1 asks for it).

The faces with flags of their own (predict, embed, diffusion, data.prepare) run in this process,
called as ``main(argv)``; train.py and bertjax.compile keep absl's global flags and their
``__main__`` start-up, so one subprocess each shows them."""

import json
import os
import sys

import pytest
import warm_python
from helpers import child_env
from inference_fixtures import write_cased_workdir

from bertjax import cli, embed, errors, export, predict
from bertjax.data.store import beam_prepare
from bertjax.objectives import diffusion_sampling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "bert_tiny.py") + ":smoke"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny model workdir and bad inputs beside it."""
    root = tmp_path_factory.mktemp("commands")
    (root / "texts.tsv").write_text("id\ttext\nr0\tApple is in Paris\n")
    (root / "no_text.jsonl").write_text(json.dumps({"sentence": "Apple"}) + "\n")
    (root / "latin1.tsv").write_bytes("id\ttext\nr0\tParis\nr1\tcaf\xe9\n".encode("latin-1"))
    (root / "not_beir").mkdir()
    (root / "latin1.txt").write_bytes("a line\nanother line\ncaf\xe9 au lait\n".encode("latin-1"))
    return root, write_cased_workdir(str(root))


def _cases(root, workdir):
    predict_to = ["predict", f"--input={root}/texts.tsv", f"--output={root}/o.jsonl"]
    return {
        "predict-missing-model": (
            predict.main,
            [*predict_to, f"--model={root}/nowhere"],
            f"--model='{root}/nowhere' is not a directory",
        ),
        "predict-misspelled-flag": (
            predict.main,
            [*predict_to, f"--model={workdir}", "--windw=100"],
            "Unknown command line flag 'windw'",
        ),
        "predict-beam-misspelled-flag": (
            predict.main,
            [*predict_to, f"--model={workdir}", "--runner=DirectRunner", "--windw=100"],
            "--windw: not a flag of bertjax.predict nor a Beam pipeline option",
        ),
        "predict-no-text-column": (
            predict.main,
            ["predict", f"--model={workdir}", f"--input={root}/no_text.jsonl"]
            + [f"--output={root}/o.jsonl"],
            f"{root}/no_text.jsonl line 1: no column 'text' (the row has ['sentence']): "
            "name the column with --text_column",
        ),
        "predict-not-utf8": (
            predict.main,
            ["predict", f"--model={workdir}", f"--input={root}/latin1.tsv"]
            + [f"--output={root}/o.jsonl"],
            f"{root}/latin1.tsv line 3: invalid UTF-8",
        ),
        "predict-bad-matmul-dtype": (  # before the model is read
            predict.main,
            [*predict_to, f"--model={workdir}", "--matmul_dtype=fp8"],
            "--matmul_dtype='fp8': one of ('auto', 'float32', 'bfloat16')",
        ),
        "embed-bad-matmul-dtype": (
            embed.main,
            ["embed", f"--model={workdir}", "--export=x", "--matmul_dtype=half"],
            "--matmul_dtype='half': one of ('auto', 'float32', 'bfloat16')",
        ),
        "embed-not-beir": (
            embed.main,
            ["embed", f"--model={workdir}", f"--beir_dir={root}/not_beir"],
            f"{root}/not_beir/corpus.jsonl not found: a BEIR directory holds corpus.jsonl",
        ),
        "embed-nothing-to-do": (
            embed.main,
            ["embed", f"--model={workdir}"],
            "give --beir_dir (metrics), --corpus (vectors), --mteb (mteb's results) or --export",
        ),
        "embed-mteb-unknown-task": (  # before the model is read
            embed.main,
            ["embed", f"--model={workdir}", "--mteb=SciFactt", f"--output={root}/o-mteb"],
            "--mteb='SciFactt': neither a directory nor an mteb task (KeyError: 'SciFactt' not "
            "found. Did you mean: 'SciFact'?)",
        ),
        "embed-mteb-not-a-task-directory": (
            embed.main,
            ["embed", f"--model={workdir}", f"--mteb={root}/not_beir", f"--output={root}/o-mteb"],
            f"--mteb='{root}/not_beir': a local task is a BEIR directory",
        ),
        "embed-mteb-without-output": (
            embed.main,
            ["embed", f"--model={workdir}", "--mteb=SciFact"],
            "--mteb needs --output=DIR (mteb's results folder)",
        ),
        "export-missing-model": (
            export.main,
            ["export", f"--model={root}/nowhere", f"--output={root}/o-export"],
            f"--model='{root}/nowhere' is not a directory",
        ),
        "export-output-taken": (  # the folder holds the inputs: nothing is written over
            export.main,
            ["export", f"--model={workdir}", f"--output={root}"],
            f"--output='{root}' exists and is not an empty folder",
        ),
        "export-private-without-push": (
            export.main,
            ["export", f"--model={workdir}", f"--output={root}/o-export", "--private"],
            "--private needs --push_to=OWNER/NAME",
        ),
        "diffusion-missing-workdir": (  # relative to the current directory (root)
            diffusion_sampling.main,
            ["--workdir=nowhere", "--prompt=x"],
            f"--workdir='{root}/nowhere' is not a directory",
        ),
        "prepare-misspelled-flag": (
            beam_prepare.main,
            ["prepare", f"--config={TINY}", f"--output={root}/store", "--outptu=x"],
            "--outptu: not a flag of bertjax.data.prepare nor a Beam pipeline option",
        ),
        "prepare-misspelled-config-key": (  # the check train.py, glue and compile make
            beam_prepare.main,
            ["prepare", f"--config={TINY}", f"--output={root}/store", "--config.data.corpuss=x"],
            "unknown config key 'config.data.corpuss'",
        ),
    }


CASES = list(_cases("R", "W"))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_status_2(case, files, capsys, monkeypatch):
    monkeypatch.chdir(files[0])
    main, argv, line = _cases(*files)[case]
    with pytest.raises(cli.BadInput) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == cli.BAD_INPUT == 2
    assert err.strip().splitlines()[-1].startswith(f"error: {line}"), err[-2000:]
    assert "Traceback" not in err
    root, _ = files
    assert not [n for n in os.listdir(root) if n.startswith(("o.", "o-", "store"))]  # nothing


def test_verbosity_1_gives_the_traceback_instead(files):
    root, _ = files
    argv = ["predict", f"--input={root}/texts.tsv", f"--output={root}/o.jsonl", "-v", "1"]
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        predict.main([*argv, f"--model={root}/nowhere"])


def test_a_failed_collective_is_the_runtime_s_not_bad_input():
    """jaxlib raises a Gloo collective's failure (a peer that vanished) as a ValueError: it is
    not bad input (status 1 with its traceback, and under --multihost a sign of a lost process
    that processes.on_error waits for the watchdog to name); a ValueError of ours stays input."""
    from bertjax.training import processes

    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error: Connection "
                      "reset by peer")  # fmt: skip
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = gloo
    assert errors.is_runtime(gloo) and errors.is_runtime(wrapped)
    assert not errors.is_runtime(ValueError("corpus.txt line 3: invalid UTF-8"))
    assert processes.exit_status(gloo) == cli.BUG
    assert processes.exit_status(ValueError("UNKNOWN token [X]")) == cli.BAD_INPUT
    with pytest.raises(ValueError, match="Gloo"), cli.input_errors(verbose=False):
        raise gloo


@pytest.mark.parametrize(
    "command,line",
    [
        (
            ["train.py", f"--config={TINY}", "--config.data.corpus={root}/latin1.txt"],
            "error: {root}/latin1.txt line 3: invalid UTF-8 (byte 3 of the line: b'\\xe9 au')",
        ),
        (
            ["-m", "bertjax.compile", f"--config={TINY}", "--topolgy=v5e-8"],
            "error: Unknown command line flag 'topolgy'. Did you mean: topology ?",
        ),
    ],
    ids=["train-corpus-not-utf8", "compile-misspelled-flag"],
)
def test_train_and_compile_answer_in_one_line(command, line, files):
    root, _ = files
    command = [c.format(root=root) for c in command]
    if command[0] == "train.py":
        command = [os.path.join(ROOT, "train.py"), *command[1:], f"--workdir={root}/w"]
    env = dict(child_env(), BERTJAX_HUGEPAGE_MALLOC="0")
    result = warm_python.run([sys.executable, *command], cwd=os.getcwd(), env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    (only,) = result.stderr.strip().splitlines()  # one line, no traceback
    assert only.startswith(line.format(root=root)), only


RAISING = (  # train.py whose training raises the exception named by argv[1]
    "import runpy, sys\n"
    "from bertjax import trainer\n"
    "from bertjax.retry import StorageUnavailable\n"
    "errors = {'bug': RuntimeError('an error bertjax did not expect'),\n"
    "          'storage': StorageUnavailable('gs://b/s/000001-00000.shard',\n"
    "                                        OSError('503 Service Unavailable'), 601.0, 23)}\n"
    "try:  # a transient error that no retry met, under a message of ours\n"
    "    try:\n"
    "        raise ConnectionResetError(104, 'Connection reset by peer')\n"
    "    except ConnectionResetError as reset:\n"
    "        raise ValueError(\"workdir 'gs://b/w' is not writable\") from reset\n"
    "except ValueError as wrapped:\n"
    "    errors['reset'] = wrapped\n"
    "error = errors[sys.argv.pop(1)]\n"
    "def train_and_evaluate(config, workdir):\n"
    "    raise error\n"
    "trainer.train_and_evaluate = train_and_evaluate\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.mark.parametrize(
    "kind,status", [("bug", cli.BUG), ("storage", cli.RETRY), ("reset", cli.RETRY)]
)
def test_a_bug_exits_1_with_its_traceback_and_unreachable_storage_75_with_one_line(
    kind, status, tmp_path
):
    """The statuses that are not bad input: a bug (1) keeps its traceback for the report;
    storage unreachable past its budget (75: restart, it resumes) is one line naming the
    object, as is a connection reset that no retry met (bertjax/errors.py reads the cause
    under our message). (0 and 2: every test that runs a command; 128+N: trainer_test.py,
    stopping_test.py; 75 from real faults: faults_test.py.)"""
    command = [sys.executable, "-c", RAISING, kind, os.path.join(ROOT, "train.py"),
               f"--config={TINY}", f"--workdir={tmp_path}"]  # fmt: skip
    env = dict(child_env(), BERTJAX_HUGEPAGE_MALLOC="0")
    result = warm_python.run(command, cwd=os.getcwd(), env=env, timeout=300)
    assert result.returncode == status, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    if kind == "bug":
        assert "Traceback (most recent call last)" in result.stderr
        assert lines[-1] == "RuntimeError: an error bertjax did not expect"
    elif kind == "reset":
        assert lines == [
            "error: storage did not answer (ConnectionResetError: [Errno 104] Connection reset "
            "by peer): workdir 'gs://b/w' is not writable; the object is not known to be bad: "
            "rerun the same command when storage answers again (the run resumes from its last "
            "checkpoint)"
        ]
    else:
        assert lines == [
            "error: storage unreachable: gs://b/s/000001-00000.shard (OSError: 503 Service "
            "Unavailable) after 23 tries over 601 s; the object is not known to be bad: rerun the "
            "same command when storage answers again (the run resumes from its last checkpoint)"
        ]
