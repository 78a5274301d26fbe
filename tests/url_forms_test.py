"""Every URL form where a path is accepted: a plain path, file://, gs:// (a local GCS emulator) and
s3:// (a local S3 server), through the same code, for each entry point that reads or writes one:
tokenizers, sharded stores (train.py from a file:// store with no tokenizer configured),
init_from directories, pair files, BEIR directories and workdirs."""

import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import warm_python
from helpers import command, env

from bertjax import paths, trainer
from bertjax.data import make_pipeline
from bertjax.data.plans.epochs import SplitEpochs
from bertjax.data.store import beam_prepare, shard_writer
from bertjax.data.store import shard_format as fmt
from bertjax.data.text import beir, corpus, pairs
from bertjax.data.tokenizer import Tokenizer
from bertjax.objectives.warm_start import PretrainedSource
from bertjax.training import checkpoint, run_config

FORMS = ("plain", "file", "gs", "s3")


@pytest.fixture(scope="module")
def sources(tmp_path_factory, small_spm):
    """One local copy of each kind of input: a SentencePiece model, a sharded store (written
    without an engine, as the Beam job's units), an HF model directory, a pair file and a BEIR
    directory."""
    root = tmp_path_factory.mktemp("url_sources")
    docs = [d for _, d in zip(range(120), corpus.iter_documents("builtin"))]
    (root / "corpus.txt").write_text("\n\n".join("\n".join(d) for _, d in docs) + "\n")
    config = trainer.default_run_config()
    config.data.corpus, config.data.tokenizer_model = str(root / "corpus.txt"), small_spm
    config.data.max_seq_length, config.data.max_predictions = 32, 5
    config.data.shard_bytes, config.data.heldout_fraction, config.data.prefetch = 8 << 10, 0.1, 0
    config.batch_size = 4
    items = shard_writer.work_items(config.data)
    spec = beam_prepare.make_spec(config, str(root / "store"), items)
    tokenizer = shard_writer.local_tokenizer(spec)
    records = [shard_writer.prepare_item(spec, item, tokenizer) for item in items]
    shard_writer.write_manifest(records, spec)

    import transformers

    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    hf = transformers.BertModel(transformers.BertConfig(vocab_size=60, **tiny))
    hf.save_pretrained(str(root / "hf"))
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
    (root / "hf" / "vocab.txt").write_text("\n".join(words + [f"w{i}" for i in range(29)]))

    rows = [{"query": f"q {i}", "positive": f"p {i}", "negatives": [f"n {i}"]} for i in range(4)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "beir" / "qrels").mkdir(parents=True)
    (root / "beir" / "corpus.jsonl").write_text('{"_id": "d1", "title": "t", "text": "x"}\n')
    (root / "beir" / "queries.jsonl").write_text('{"_id": "q1", "text": "what"}\n')
    (root / "beir" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return config, root


@pytest.fixture(params=FORMS)
def place(request):
    """(form, put): put(local path, name) gives the path in this form (a copy under the bucket
    for gs:// and s3://)."""
    form = request.param
    bucket = {"gs": "gcs_bucket", "s3": "s3_bucket"}.get(form)
    root = request.getfixturevalue(bucket) + "/url_forms" if bucket else ""

    def put(local, name: str) -> str:
        local = str(local)
        if form == "plain":
            return local
        if form == "file":
            return f"file://{local}"
        url = f"{root}/{name}"
        fs, path = fmt.filesystem(url)
        if not fs.exists(path):
            fs.put(local, path, recursive=os.path.isdir(local))
        return url

    return form, put


def test_tokenizers(place, small_spm):
    _, put = place
    texts = ["The store reads its own rows.", "Hosts read byte ranges."]
    expected = Tokenizer(small_spm).encode(texts)
    ours = Tokenizer(put(small_spm, "spm.model"))
    assert [a.tolist() for a in ours.encode(texts)] == [a.tolist() for a in expected]


def test_stores_train_with_the_stores_own_tokenizer(place, sources):
    """config.data.store in any form, no tokenizer configured: the batches of the plain path."""
    config, root = sources
    _, put = place
    batches = []
    for store in (str(root / "store"), put(root / "store", "store")):
        c = config.copy_and_resolve_references()
        c.data.store, c.data.tokenizer_model = store, ""
        c = run_config.resolve_paths(c)
        batches.append(make_pipeline(c, "").batch(0))
    for key, value in batches[0].items():
        np.testing.assert_array_equal(batches[1][key], value, err_msg=key)


def test_init_from_directories(place, sources):
    _, root = sources
    _, put = place
    local = PretrainedSource(str(root / "hf"), "config.init_from")
    source = PretrainedSource(put(root / "hf", "hf"), "config.init_from")
    jax.tree.map(np.testing.assert_array_equal, source.params(), local.params())
    assert source.model_config() == local.model_config()


def test_pair_files_and_beir_directories(place, sources):
    _, root = sources
    _, put = place
    assert pairs.read_pairs(put(root / "pairs.jsonl", "pairs.jsonl")) == pairs.read_pairs(
        str(root / "pairs.jsonl")
    )
    assert beir.read_beir(put(root / "beir", "beir")) == beir.read_beir(str(root / "beir"))


@flax.struct.dataclass
class _State:
    step: jax.Array
    params: dict
    opt_state: dict


def test_workdirs(place, tmp_path):
    """Checkpoints save and restore in a workdir of each form orbax writes to; an s3:// workdir
    stops before training with what to do (orbax 0.12 writes arrays to local paths and gs://
    only), while the run's other files (metrics, tokenizer) go there like anywhere."""
    form, put = place
    workdir = put(tmp_path, f"workdir-{os.getpid()}") if form in ("gs", "s3") else put(tmp_path, "")
    paths.write_text(paths.join(workdir, "metrics.jsonl"), '{"step": 1}\n')
    assert json.loads(paths.read_text(paths.join(workdir, "metrics.jsonl"))) == {"step": 1}
    if form == "s3":
        with pytest.raises(ValueError, match="orbax writes arrays to local paths and gs://"):
            checkpoint.Checkpointer(paths.join(workdir, "checkpoints"))
        return
    state = _State(step=jnp.int32(7), params={"w": jnp.arange(3.0)}, opt_state={})
    ckpt = checkpoint.Checkpointer(paths.join(workdir, "checkpoints"), async_save=False)
    ckpt.save(state, {"config": {}}, force=True)
    restored, _ = ckpt.restore(
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    )
    ckpt.close()
    assert int(restored.step) == 7
    np.testing.assert_array_equal(restored.params["w"], [0.0, 1.0, 2.0])


def _capped_lanes(store: str):
    """(config overrides, steps an epoch) of configs/bert_tiny.py on ``store``: a batch in lanes of
    32 rows (set: the default is 256) and pieces of a few thousand tokens, too few pieces for its
    lanes, two or more steps an epoch, and an epoch that, as long as its lanes' units (before
    issue 61), ran past a lane's units in its last step. (The session's tokenizer, so the store,
    differs from run to run: the sizes are found, not fixed.)"""
    config = trainer.load_config_file(os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "bert_tiny.py"))  # fmt: skip
    config.data.update(store=store, tokenizer_model="", max_seq_length=32, prefetch=0)
    opened = make_pipeline(config, "", process_index=0, process_count=1).store
    for batch in (1024, 768, 640, 512, 384, 256):  # three epochs in the fewest steps first
        for piece_tokens in range(2000, 6000, 100):
            config.batch_size, config.data.piece_tokens = batch, piece_tokens
            order = SplitEpochs(opened, config, batch, "train", lane_rows=32).epoch(32, 0)
            units = order.lanes * order.per_lane * order.r  # the epoch's length before issue 61
            per_epoch = len(order) // batch
            capped = 1 < order.lanes < batch // 32
            if capped and per_epoch >= 2 and units // batch > per_epoch:
                overrides = {"batch_size": batch, "data.piece_tokens": piece_tokens}
                return dict(overrides, **{"data.lane_rows": 32}), per_epoch
    pytest.fail(f"no batch and piece size over the store {store} make capped lanes")


def test_train_py_from_a_file_url_store_without_a_tokenizer(sources, tmp_path):
    """The README's command with file:// for the store and the workdir, no tokenizer given,
    through three epoch ends of a store whose lanes are capped by its pieces."""

    _, root = sources
    store = f"file://{root}/store"
    capped, per_epoch = _capped_lanes(store)
    steps = 3 * per_epoch + 1
    run = command(
        f"file://{tmp_path}/run",
        steps=steps,
        every=steps,
        extra=[
            f"--config.data.store={store}",
            "--config.data.tokenizer_model=",
            "--config.optim.warmup_steps=1",
            *(f"--config.{key}={value}" for key, value in capped.items()),
        ],
    )
    result = warm_python.run(run, cwd=os.getcwd(), env=env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isdir(tmp_path / "run" / "checkpoints" / str(steps))
    meta = json.loads(
        (tmp_path / "run" / "checkpoints" / str(steps) / "meta" / "metadata").read_text()
    )
    assert meta["tokenizer_file"].endswith("spm.model")
    ran = meta["config"]
    assert (ran["batch_size"], ran["data"]["piece_tokens"], ran["data"]["lane_rows"]) == (
        capped["batch_size"], capped["data.piece_tokens"], 32,
    )  # fmt: skip
