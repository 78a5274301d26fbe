"""What a real run leaves for others: its trackers, its profile and its Hub-ready export. One
shrunken BERT-tiny run (configs/bert_tiny.py, in this process) with
``config.trackers=tensorboard,jsonl,wandb`` (W&B's own client in its offline mode) and
``config.profile``, restarted once; then `python -m bertjax.export` of it, reloaded in
transformers and compared with bertjax's outputs, its model card read back by huggingface_hub.

W&B writes its run folder (WORKDIR/wandb/offline-run-*-ID/run-ID.wandb, a LevelDB-style log of
protobuf records, read here with wandb's own `Record` message); a counting HTTP server on the
loopback stands as W&B's server and as the proxy for everything else, and hears nothing. A
second start of the same workdir continues the same W&B run id. The profile's XSpace file is
read with `jax.profiler.ProfileData`, and its Chrome-trace JSON with the standard library. The
fine-tuned models' exports are tests/export_test.py's.
"""

import collections
import contextlib
import glob
import gzip
import http.server
import io
import json
import os
import struct
import threading
import time

import ml_collections
import pytest
from helpers import ROOT, shrink

from bertjax.training import profiling, run_record, trackers

pytestmark = pytest.mark.slow

STEPS = 4
PROFILED = (2, 3)  # config.profile: first_step=2, steps=2


def tiny_config(tokenizer: str):
    """configs/bert_tiny.py (train.py's default) shrunk (tests/helpers.py), tracked by all three
    trackers and profiled at steps 2-3."""
    from bertjax import trainer

    config = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_tiny.py"))
    shrink(config, STEPS)
    config.data.tokenizer_model = tokenizer
    config.checkpoint_every = 2
    config.trackers = "tensorboard,jsonl,wandb"
    config.wandb.project, config.wandb.tags = "bertjax-tests", "test,offline"
    config.profile.first_step = PROFILED[0]
    config.profile.steps = PROFILED[1] - PROFILED[0] + 1
    return config


class _Counter(http.server.BaseHTTPRequestHandler):
    """Counts every request (a proxy's CONNECT too) and answers 503."""

    requests: list = []

    def _count(self):
        self.requests.append(f"{self.command} {self.path}")
        self.send_response(503)
        self.end_headers()

    do_GET = do_POST = do_PUT = do_CONNECT = do_HEAD = _count

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def counting_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Counter.requests
    server.shutdown()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, counting_server, small_spm):
    """The run (in this process, on one device), then a second start of the same workdir
    (trained already: it evaluates); W&B offline, its server and every proxy the loopback
    counter, no credentials."""
    from helpers import first_device_only

    from bertjax import trainer

    server, requests = counting_server
    workdir = str(tmp_path_factory.mktemp("tracked"))
    with pytest.MonkeyPatch.context() as patch:
        for key in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_DIR", "NO_PROXY"):
            patch.delenv(key, raising=False)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_BASE_URL", server)
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            patch.setenv(key, server)
        outputs = []
        with first_device_only():
            for _ in range(2):
                capture = io.StringIO()
                with contextlib.redirect_stdout(capture):
                    summary = trainer.train_and_evaluate(tiny_config(small_spm), workdir)
                outputs.append((summary, capture.getvalue()))
    return workdir, outputs, list(requests)


def _wandb_records(path: str) -> list:
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
    LevelDB log blocks of 32 KiB, each chunk a 7-byte header (crc32, length, type: 1 whole,
    2 first, 3 middle, 4 last) and its bytes."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, position, pending = [], 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _finished_records(path: str, timeout: float = 60.0) -> list:
    """The records of a .wandb file once it holds the run's exit record (W&B's service process
    writes the file; its last records may land a moment after ``run.finish()`` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _wandb_records(path) if os.path.exists(path) else []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path} holds no exit record"
        time.sleep(0.2)


def _items(items) -> dict:
    return {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in items}


def test_wandb_offline_run_holds_config_metrics_and_final_eval_and_nothing_left(tracked):
    workdir, outputs, requests = tracked
    run_id = run_record.read_record(workdir).run_id
    folders = sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*")))
    # one folder per start, both under the bertjax run's id: the second continues the run
    assert len(folders) == 2 and all(f.endswith(f"-{run_id}") for f in folders)
    first = _finished_records(os.path.join(folders[0], f"run-{run_id}.wandb"))
    kinds = collections.defaultdict(list)
    for record in first:
        kinds[record.WhichOneof("record_type")].append(record)
    (run,) = kinds["run"]
    assert (run.run.run_id, run.run.project) == (run_id, "bertjax-tests")
    assert run.run.display_name == os.path.basename(workdir)
    assert list(run.run.tags) == ["test", "offline"]
    config = _items(run.run.config.update)
    assert config["trackers"] == "tensorboard,jsonl,wandb"
    assert config["num_train_steps"] == STEPS and config["profile"]["first_step"] == PROFILED[0]
    history = [_items(record.history.item) for record in kinds["history"]]
    assert [h["_step"] for h in history if "train/loss" in h] == list(range(1, STEPS + 1))
    jsonl = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    logged = {h["_step"]: h["train/loss"] for h in history if "train/loss" in h}
    assert logged == {r["step"]: r["train/loss"] for r in jsonl if "train/loss" in r}
    summary = {}
    for record in kinds["summary"]:
        summary.update(_items(record.summary.update))
    final = outputs[0][0]
    assert summary["eval/mlm_accuracy"] == final["eval/mlm_accuracy"]
    assert summary["step"] == STEPS and summary["stopped_by_signal"] is False
    assert kinds["exit"][0].exit.exit_code == 0
    # the restart: the same run, its evaluation of the trained state in its summary
    second = _finished_records(os.path.join(folders[1], f"run-{run_id}.wandb"))
    (rerun,) = [r for r in second if r.WhichOneof("record_type") == "run"]
    assert rerun.run.run_id == run_id
    resumed = {}
    for record in second:
        if record.WhichOneof("record_type") == "summary":
            resumed.update(_items(record.summary.update))
    assert resumed["eval/mlm_accuracy"] == final["eval/mlm_accuracy"]
    starts = run_record.read_record(workdir).starts
    assert [s["step"] for s in starts] == [0, STEPS]
    assert starts[0]["platform"] == "cpu" and starts[0]["devices"] == 1
    # W&B's server address and the proxies were the loopback counter: nothing was sent
    assert requests == []


def test_tensorboard_events_hold_the_config_and_the_scalars(tracked):
    from tensorboard.backend.event_processing import event_accumulator

    workdir = tracked[0]
    events = event_accumulator.EventAccumulator(workdir, size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))
    texts = events.Tensors("config/text_summary")  # one a start
    assert len(texts) == 2
    for text in texts:
        assert '"trackers": "tensorboard,jsonl,wandb"' in text.tensor_proto.string_val[0].decode()


def test_tensorboard_events_are_written_without_torch_boto3_or_gcs_imported(tmp_path):
    """tensorboardX imports torch, boto3 and google.cloud.storage when it can (seconds of every
    launch); the tracker imports it with them hidden, in a fresh process where all three are
    installed, and they import normally after."""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "from bertjax.training import trackers\n"
        "events = trackers.TensorBoard(sys.argv[1], {'k': 1})\n"
        "events.write_scalars(1, {'train/loss': 2.0})\n"
        "events.close()\n"
        "print(sorted(m for m in trackers.TENSORBOARDX_SKIPS if m in sys.modules))\n"
        "import boto3, torch\n"
        "from google.cloud import storage\n"
        "print('imported after')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["[]", "imported after"], out.stdout
    assert glob.glob(str(tmp_path / "events.out.tfevents.*")), os.listdir(tmp_path)


def test_the_profile_holds_exactly_the_chosen_steps_and_names_their_ops(tracked):
    from jax.profiler import ProfileData

    workdir, outputs, _ = tracked
    first, last = PROFILED
    (run,) = glob.glob(os.path.join(workdir, "plugins", "profile", "*"))
    assert os.path.basename(run) == f"steps-{first}-{last}"
    assert f"profile of steps {first}-{last}: {run}" in outputs[0][1]
    assert "profile of steps" not in outputs[1][1]  # the restart passed the window
    (xplane,) = glob.glob(os.path.join(run, "*.xplane.pb"))
    ops = collections.defaultdict(set)  # one execution of a program (its run_id) -> HLO ops
    modules = {}
    for plane in ProfileData.from_file(xplane).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_module" in stats:
                    ops[stats["run_id"]].add(stats["hlo_op"])
                    modules[stats["run_id"]] = stats["hlo_module"]
    # the two chosen steps of the train step and nothing else: no earlier step still running,
    # no eval, the step compiled before
    assert sorted(modules.values()) == ["jit_train_step"] * (last - first + 1)
    executions = list(ops.values())
    assert executions[0] == executions[1] and len(executions[0]) > 50
    (trace,) = glob.glob(os.path.join(run, "*.trace.json.gz"))
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    named = {e["args"]["hlo_op"] for e in events if e.get("args", {}).get("hlo_module")}
    assert named == executions[0]


def test_bad_tracker_and_profile_settings_are_named():
    from bertjax.trainer import default_run_config
    from bertjax.training.run_config import validate_run_config

    config = default_run_config()
    assert trackers.chosen(config) == ("tensorboard", "jsonl")
    config.trackers = "tensorbord,jsonl"
    with pytest.raises(ValueError, match=r"config.trackers='tensorbord,jsonl': name each of"):
        validate_run_config(config)
    config.trackers = "jsonl,jsonl"
    with pytest.raises(ValueError, match="at most once"):
        trackers.chosen(config)
    config.trackers = "jsonl"
    config.profile.steps = -1
    with pytest.raises(ValueError, match=r"config.profile.steps=-1: must be 0 or more"):
        validate_run_config(config)


def test_the_trace_window_skips_compilation_and_what_a_restart_passed():
    profile = ml_collections.ConfigDict({"first_step": 0, "steps": 3, "all_processes": False})
    window = profiling.trace_window
    assert window(profile, 0) == (2, 4)  # step 1 compiles
    assert window(profile, 100) == (102, 104)  # a restart compiles again
    profile.first_step = 10
    assert window(profile, 0) == (10, 12)
    assert window(profile, 10) == (12, 14)  # resumed inside it: as many steps, after compiling
    assert window(profile, 12) is None  # resumed past it: traced before
    profile.steps = 0
    assert window(profile, 0) is None


# ---- the export of the run (python -m bertjax.export) ----

TEXTS = [
    "Return the number of items in a container.",
    "The with statement wraps a block in the methods of a context manager.",
]


@pytest.fixture(scope="module")
def exported(tracked, tmp_path_factory):
    from bertjax.export import main

    folder = str(tmp_path_factory.mktemp("exported") / "bert-tiny-stdlib")
    main(["export", f"--model={tracked[0]}", f"--output={folder}"])
    return folder


def test_the_export_reloads_in_transformers_within_1e4(tracked, exported):
    import jax
    import numpy as np
    import torch
    import transformers

    from bertjax.inference import loading
    from bertjax.modeling.heads import BertForPreTraining

    model = loading.load(tracked[0])
    assert sorted(os.listdir(exported)) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    for row, ids, mask in zip(
        inputs["input_ids"], model.tokenizer.encode(TEXTS), inputs["attention_mask"]
    ):
        framed = [model.tokenizer.cls_id, *ids.tolist(), model.tokenizer.sep_id]
        assert row[mask.bool()].tolist() == framed  # bertjax's ids, framed as its rows are
    hf = transformers.AutoModelForPreTraining.from_pretrained(exported).eval()
    assert type(hf).__name__ == "BertForPreTraining"
    with torch.no_grad():
        theirs = hf(**inputs)
    arrays = {k: v.numpy() for k, v in inputs.items()}
    ours = jax.jit(BertForPreTraining(model.cfg).apply)({"params": model.params}, **arrays)
    real = arrays["attention_mask"].astype(bool)
    mlm = np.abs(np.asarray(ours["mlm_logits"]) - theirs.prediction_logits.numpy())[real]
    nsp = np.abs(np.asarray(ours["nsp_logits"]) - theirs.seq_relationship_logits.numpy())
    assert mlm.max() < 1e-4 and nsp.max() < 1e-4, (mlm.max(), nsp.max())


def test_the_card_carries_the_run_s_facts(tracked, exported):
    from huggingface_hub import ModelCard, metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    workdir = tracked[0]
    meta = metadata_load(os.path.join(exported, "README.md"))
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert meta["pipeline_tag"] == "fill-mask" and "bertjax" in meta["tags"]
    facts = meta["bertjax"]
    assert facts["run_id"] == run_record.read_record(workdir).run_id  # W&B's run id too
    assert facts["objective"] == "pretraining" and facts["steps"] == STEPS
    assert facts["rows"] == STEPS * 8 and facts["tokens"] == STEPS * 8 * 32
    assert facts["hardware"] == ["1 x cpu (1 process)"]  # two starts on the same hardware
    assert "built-in corpus" in facts["training_data"][0]["description"]
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == "bert-tiny-stdlib"
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    (evaluation,) = [r for r in rows if "eval/mlm_accuracy" in r]
    assert evaluation["step"] == STEPS
    assert {r.metric_type: r.metric_value for r in results} == {
        k[5:]: v for k, v in evaluation.items() if k.startswith("eval/")
    }
    assert {(r.task_type, r.dataset_split) for r in results} == {("fill-mask", "held-out")}
    card = ModelCard.load(os.path.join(exported, "README.md"))
    assert card.data.model_name == "bert-tiny-stdlib"
    assert f"| Tokens | {STEPS * 8 * 32:,} (rows x row length" in card.text
    assert "AutoModelForMaskedLM" in card.text


# ---- the push (python -m bertjax.export --push_to), last: the local Hub takes uploads ----

REPO_ID = "bertjax-test/bert-tiny-stdlib"


@pytest.fixture(scope="module")
def writable_hub(hub, tmp_path_factory):
    """The local Hub (tests/hub_server.py) with its upload endpoints (tests/hub_upload.py), our
    token, and huggingface_hub uploading through Git LFS (Xet is not served here)."""
    from hub_server import TOKEN, use_endpoint
    from hub_upload import add_upload_routes

    add_upload_routes(hub)
    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_DISABLE_XET", "1")
        with use_endpoint(hub.url, home, token=TOKEN):
            yield hub


def test_push_uploads_the_folder_with_huggingface_hub_s_own_upload(
    tracked, writable_hub, tmp_path, capsys
):
    import transformers
    from huggingface_hub import HfApi, ModelCard, snapshot_download

    from bertjax.export import main, push

    hub, folder = writable_hub, str(tmp_path / "push")
    hub.reset()
    main(["export", f"--model={tracked[0]}", f"--output={folder}", f"--push_to={REPO_ID}"])
    info = HfApi().model_info(REPO_ID)
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said == f"pushed to {REPO_ID}: {hub.url}/{REPO_ID}/commit/{info.sha}"
    # one repository, one preupload, one commit (the card's metadata checked before it); the
    # weights through Git LFS
    counts = {k: hub.count(k) for k in ("create-repo", "preupload", "commit")}
    assert counts == {"create-repo": 1, "preupload": 1, "commit": 1}
    assert hub.count("validate-yaml", status=200) >= 1 and hub.count(status=400) == 0
    assert hub.count("lfs-batch") == 1 and hub.count("lfs-upload") == 1  # model.safetensors
    local = snapshot_download(REPO_ID, revision=info.sha, cache_dir=str(tmp_path / "cache"))
    for name in os.listdir(folder):
        with (
            open(os.path.join(folder, name), "rb") as a,
            open(os.path.join(local, name), "rb") as b,
        ):
            assert a.read() == b.read(), name
    assert transformers.AutoModelForPreTraining.from_pretrained(local).num_parameters() > 0
    card = ModelCard.load(os.path.join(local, "README.md"))
    assert card.data.model_name == REPO_ID and f'from_pretrained("{REPO_ID}")' in card.text
    # pushing the same folder again: every file is unchanged, so no commit is made
    assert push(folder, REPO_ID).endswith(info.sha)
    assert hub.count("commit") == 1 and HfApi().model_info(REPO_ID).sha == info.sha


def test_a_push_the_hub_refuses_is_one_line(tracked, writable_hub, tmp_path, capsys):
    from hub_server import use_endpoint

    from bertjax.export import main

    with use_endpoint(writable_hub.url, tmp_path / "anonymous", token=None):  # no token
        with pytest.raises(SystemExit) as stop:
            main(["export", f"--model={tracked[0]}", f"--output={tmp_path}/o", "--push_to=a/b"])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: --push_to='a/b': the Hub answered 401")
    assert "HF_TOKEN" in line
