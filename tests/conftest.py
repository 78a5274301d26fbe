"""Test session set-up: 8 fake CPU devices for sharding tests, XLA's fast-compile flags
(helpers.FAST_XLA_FLAGS), fp32 matmuls, one XLA compilation cache for the run (subprocesses
too), and the session's shared tokenizers."""

import atexit
import gc
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _fast_xla_flags() -> str:
    """helpers.FAST_XLA_FLAGS where this jaxlib knows them (an unknown XLA flag aborts the
    process), else nothing; checked once per run in a child process, inherited by the workers."""
    import subprocess
    import sys

    from helpers import FAST_XLA_FLAGS

    probe = "import jax; jax.numpy.zeros(1).block_until_ready()"
    env = dict(os.environ, XLA_FLAGS=FAST_XLA_FLAGS, JAX_PLATFORMS="cpu")
    ok = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode
    return FAST_XLA_FLAGS if ok == 0 else ""


if "BERTJAX_TEST_XLA_FLAGS" not in os.environ:
    os.environ["BERTJAX_TEST_XLA_FLAGS"] = _fast_xla_flags()
# Must happen before jax is imported anywhere: sharding tests need several devices.
os.environ.setdefault(
    "XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {os.environ['BERTJAX_TEST_XLA_FLAGS']}"
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# gcsfs's experimental bucket-type lookup (a gRPC call the GCS emulator does not serve) fails,
# warns and is retried on every request, which slows the emulator tests and floods their logs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Identical computations (the same tiny model in several train.py subprocesses, configs that
# shrink to the same shapes) compile once per test run; the cache starts empty every run. Only
# programs that took 0.2 s or more to compile are written: steps, inits, evals, which later
# processes reuse. The thousands of one-op programs that eager test code compiles (~15 ms each)
# are not worth a file each.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="bertjax-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
# train.py subprocesses keep bertjax's own cache (bertjax/training/compile_cache.py: entries in
# its format, a JAX one beside them would be a miss each time), by default in each run's fresh
# workdir; one for the whole run instead: a train.py run of a recipe the suite compiled before
# takes ~40% less CPU (bert_base:smoke, 13.2 vs 8.0 s). Tests of the workdir default unset it.
# train.py and the benchmarks restart their interpreter once with glibc malloc tunables
# (bertjax/training/runtime.py): ~0.5 s a subprocess for nothing a test checks; runtime_test
# runs the restart itself.
os.environ.setdefault("BERTJAX_HUGEPAGE_MALLOC", "0")
if "BERTJAX_COMPILE_CACHE" not in os.environ:
    _train_cache = tempfile.mkdtemp(prefix="bertjax-tests-train-cache-")
    atexit.register(shutil.rmtree, _train_cache, ignore_errors=True)
    os.environ["BERTJAX_COMPILE_CACHE"] = _train_cache

# A worker's heap holds jax, torch, transformers, TensorFlow and Beam: Python's default gen-0
# threshold (700 allocations) runs a collection, and JAX's gc callback with it, every few hundred
# traced ops, and a full one over that heap every ~70,000. Ten times fewer (collections still
# run: nothing leaks across tests).
gc.set_threshold(7000, 10, 10)

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402


def _builtin_spm(tmp_path_factory, vocab_size: int) -> str:
    from bertjax.data.text import corpus
    from bertjax.data.tokenizer import train_sentencepiece

    sentences = (s for _, d in corpus.iter_documents("builtin") for s in d)
    directory = tmp_path_factory.getbasetemp() / f"builtin_spm_{vocab_size}"
    return train_sentencepiece(sentences, str(directory), vocab_size=vocab_size)


@pytest.fixture(scope="session")
def builtin_spm(tmp_path_factory) -> str:
    """One 1000-piece SentencePiece model of the built-in corpus for the whole run: what the data
    tests use where they need *a* tokenizer (not a particular one)."""
    return _builtin_spm(tmp_path_factory, 1000)


@pytest.fixture(scope="session")
def small_spm(tmp_path_factory) -> str:
    """A 400-piece model of the built-in corpus: the end-to-end runs' tokenizer (tiny models learn
    within their few steps at this vocabulary)."""
    return _builtin_spm(tmp_path_factory, 400)


@pytest.fixture(scope="module")
def session_tokenizer_runs(small_spm):
    """The module's train.py runs (tests/helpers.py `command`) use the session's SentencePiece
    model (none trains its own)."""
    from helpers import SHRINK

    SHRINK.append(f"--config.data.tokenizer_model={small_spm}")
    yield
    SHRINK.remove(f"--config.data.tokenizer_model={small_spm}")


def _kill_what_was_left():
    """Processes started (tests/warm_python.py `popen`) from here to the fixture's end and still
    running are killed: a test or fixture that failed while train.py processes ran leaves none
    behind to retry storage, hold a port or slow the rest of the run."""
    import warm_python

    mark = len(warm_python.STARTED)
    yield
    left = warm_python.kill_running(warm_python.STARTED[mark:])
    del warm_python.STARTED[mark:]
    if left:
        print(f"killed {len(left)} process(es) left running: {[p.args for p in left]}")


# The module's for those its fixtures start (started before a test's own fixtures are set up).
_kill_left_by_module = pytest.fixture(scope="module", autouse=True)(_kill_what_was_left)
_kill_left_by_test = pytest.fixture(autouse=True)(_kill_what_was_left)


@pytest.fixture
def one_device():
    """The test's in-process runs train on one device (`helpers.first_device_only`)."""
    from helpers import first_device_only

    with first_device_only():
        yield


@pytest.fixture(scope="session")
def gcs_bucket():
    """A Google Cloud Storage emulator on the loopback address (tests/gcs_emulator.py, started
    here) that both orbax's TensorStore and epath (gcsfs) speak; yields ``gs://BUCKET``. The
    emulator's address goes into this process's environment, so subprocesses use it too."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "gcs_emulator.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    env = {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs (epath's gs:// backend)
        "TENSORSTORE_GCS_HTTP_URL": url,  # orbax's array writes
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "GOOGLE_CLOUD_PROJECT": "bertjax-test",
    }
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for _ in range(100):
            try:
                request = urllib.request.Request(
                    f"{url}/storage/v1/b?project=bertjax-test",
                    data=json.dumps({"name": "bertjax-test"}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                urllib.request.urlopen(request, timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the GCS emulator did not start")
        yield "gs://bertjax-test"
    finally:
        server.terminate()
        server.wait(timeout=30)
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3_bucket():
    """A local S3 server (moto's, in a thread of this process) that s3fs, and so epath and
    fsspec, speak; yields ``s3://BUCKET``. Its address goes into this process's environment."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("bertjax-test")
        yield "s3://bertjax-test"
    finally:
        server.stop()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hugging Face Hub on the loopback (tests/hub_server.py, in a thread of this process), empty:
    add repositories with ``hub.commit(repo_id, {path: bytes}, repo_type=...)``. huggingface_hub in
    this process and in its children talks to it (``HF_ENDPOINT``), with a cache and token file of
    the module's own (``HF_HOME``) and no token; ``hub.count(kind)`` counts the requests served,
    ``hub.fail(kind, status, ...)`` injects faults, ``hub.reset()`` forgets both."""
    from hub_server import HubServer, use_endpoint

    root = tmp_path_factory.mktemp("hub")
    with HubServer(root / "repos") as server, use_endpoint(server.url, root / "hf_home"):
        yield server


# Test modules, heaviest first (summed --durations of a full run on the 2-core machine). xdist
# hands whole modules to its workers (loadscope) in collection order; by default it would order
# them by test count, which left the few-test, minute-long modules (notebooks, benchmarks, the
# kill -9 and two-process runs) to the end, one worker busy and the other idle. Heaviest first
# is the longest-processing-time rule. A module missing here only runs later.
HEAVIEST_FIRST = (
    "docs_test",
    "configs_test",
    "faults_test",
    "multiprocess_test",
    "benchmarks_test",
    "phases_test",
    "compile_test",
    "install_test",
    "trainer_test",
    "notebooks_test",
    "objective_contract_test",
    "model_test",
    "real_checkpoint_test",
    "glue_test",
    "stream_test",
    "modernbert_test",
    "sharding_test",
    "electra_test",
    "remote_workdir_test",
    "moe_test",
    "fit_test",
    "distill_test",
    "attention_kernels_test",
    "hf_saves_test",
    "convert_test",
    "mteb_test",
    "url_forms_test",
    "pert_test",
    "embedding_test",
    "diffusion_test",
    "finetune_test",
    "run_config_test",
    "optim_test",
    "run_outputs_test",
    "commands_test",
    "hub_corpus_test",
    "data_shards_test",
    "causal_lm_test",
    "optim_modern_test",
    "predict_test",
)


COLLECTED = pytest.StashKey[int]()  # tests collected, before -k/-m deselect any (readme_test)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[COLLECTED] = len(items)
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: order within


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """loadscope that survives a crashed worker (tests/xdist_scheduler.py); None: xdist's own
    for the other --dist modes."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist_scheduler import LoadScopeAfterCrashes

    return LoadScopeAfterCrashes(config, log)
