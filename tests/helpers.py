"""Helpers shared by several test modules (one place, instead of test modules importing each
other's private helpers): train.py subprocess runs on a shrunken recipe, the Hugging Face parity
helpers, and a small Chinese corpus. The step tests' tiny setup lives in two_process_worker.py
(a name from when it was also the two-process worker script)."""

import contextlib
import json
import os
import socket
import sys
import time

import numpy as np

# ---- processes (multi-process and kill -9 tests) ----


def free_port() -> int:
    """A free localhost TCP port for a jax.distributed coordinator."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The suite's XLA on the CPU (conftest sets it; subprocesses get it through `xla_flags`): -O0 and
# the classic fusion emitters instead of the MLIR ones. Together they compile a tiny model's step
# ~2x faster, and the suite is mostly compiling (model/moe/modernbert/attention/optim/sharding/
# electra tests: 384 s -> 237 s on this machine); -O0 alone gains little. Both are XLA debug
# options: the programs compute the same ops, only less optimized.
FAST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a test process: ``devices`` fake CPU devices (None: jax's own count, so that
    jax_num_cpu_devices can set it) and the suite's fast-compile flags when this jaxlib has them
    (conftest checks once and records it in BERTJAX_TEST_XLA_FLAGS)."""
    count = f"--xla_force_host_platform_device_count={devices}" if devices else ""
    return f"{count} {os.environ.get('BERTJAX_TEST_XLA_FLAGS', '')}".strip()


@contextlib.contextmanager
def first_device_only():
    """Inside, `jax.devices()` is this worker's first CPU device alone, so the trainer's mesh spans
    one device: for in-process runs of many steps whose point is not sharding (a step on the
    worker's 8 fake devices costs several times one device's; sharding has tests of its own)."""
    import jax
    import pytest

    first = jax.devices()[:1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "devices", lambda backend=None: list(first))
        yield


def child_env() -> dict:
    """The environment of a child JAX process: CPU only, this checkout first on the path."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags()  # no device count: it would override jax_num_cpu_devices
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return env


# ---- model and optimizer code under jit (model, modernbert, optim tests) ----


def jit_apply(module, variables, *args, **kwargs):
    """``module.apply(variables, *args, **kwargs)`` as one jitted program. Run eagerly, an apply
    compiles one XLA program per op and shape (hundreds for a 2-layer model, ~15 ms each); the
    whole model compiles in about the time of a few dozen of them, with the same results to
    float32 rounding. Keywords that hold no array (``deterministic=True``, ``method=``,
    ``mutable=[...]``) stay static; the module is closed over. jax is
    imported here: conftest reads this module before jax's flags are set."""
    import functools

    import jax

    static = {  # keywords holding no array: closed over
        k: v for k, v in kwargs.items() if not any(hasattr(x, "shape") for x in jax.tree.leaves(v))
    }
    dynamic = {k: v for k, v in kwargs.items() if k not in static}
    return jax.jit(functools.partial(module.apply, **static))(variables, *args, **dynamic)


def apply_steps(tx, params, grads):
    """``params`` after one step of the optax transformation ``tx`` per tree in ``grads``, each
    step one jitted program (eagerly: one program per op and leaf shape)."""
    import jax
    import optax

    @jax.jit
    def step(g, state, current):
        updates, state = tx.update(g, state, current)
        return optax.apply_updates(current, updates), state

    state, current = jax.jit(tx.init)(params), params
    for g in grads:
        current, state = step(g, state, current)
    return current


# ---- train.py runs (trainer, electra, remote workdir tests) ----

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every test run of train.py: no progress bar, one batch prefetched, XLA -O0 (these runs are
# mostly compiling), no CPU matmul peak measured at start (~1 s each).
QUIET_RUN = [
    "--config.progress_bar=False",
    "--config.data.prefetch=1",
    "--config.fast_compile=True",
    "--config.peak_flops_per_device=1e12",
]
SHRINK = [
    "--config.batch_size=8",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions=5",
    "--config.model.hidden_size=32",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=64",
    "--config.optim.warmup_steps=5",
    "--config.log_every=5",
    "--config.eval_every=0",
    *QUIET_RUN,
]


def shrink(config, steps: int):
    """An in-process run's config shrunk as SHRINK shrinks train.py's: BERT-tiny's width 32, 2
    heads, batch 8 of 32 tokens, ``steps`` steps with a log each and an eval at the end (one
    batch), a checkpoint at the end, XLA -O0, no progress bar."""
    config.batch_size, config.num_train_steps = 8, steps
    config.data.max_seq_length, config.data.max_predictions, config.data.prefetch = 32, 5, 1
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size = 64
    config.optim.warmup_steps = 1
    config.log_every, config.eval_every, config.eval_batches = 1, steps, 1
    config.checkpoint_every = 0
    config.progress_bar, config.fast_compile, config.peak_flops_per_device = False, True, 1e12
    return config


def env(devices=1):
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(devices)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def command(workdir, steps=30, every=10, extra=(), config=None):
    """train.py on ``config`` (default: configs/bert_tiny.py), shrunk; --config comes first."""
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        *([f"--config={config}"] if config else []),
        f"--workdir={workdir}",
        f"--config.num_train_steps={steps}",
        f"--config.checkpoint_every={every}",
        *SHRINK,
        *extra,
    ]


def run(workdir, devices=1, **kwargs):
    import warm_python

    result = warm_python.run(command(workdir, **kwargs), cwd=ROOT, env=env(devices), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.index("{") :])


def checkpoint_steps(workdir):
    path = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def final_params(workdir, step):
    """The saved params of a step, read back with orbax as plain numpy."""
    import orbax.checkpoint as ocp

    path = os.path.join(workdir, "checkpoints", str(step), "state")
    tree = ocp.StandardCheckpointer().restore(path)
    return tree["params"]


def wait_for(predicate, process, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            raise AssertionError(f"trainer exited early: {process.stderr.read()[-3000:]}")
        time.sleep(0.2)
    process.kill()
    raise AssertionError("timed out waiting for the trainer")


# ---- Hugging Face parity (convert, electra_convert, hf_saves tests) ----

TOL = 1e-5
COMMON = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def randomize(model, seed):
    """Random values for every parameter, biases and LayerNorms included (stronger than HF init)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "LayerNorm" in name or "layer_norm" in name else 0.05
            base = 1.0 if name.endswith(("LayerNorm.weight", "layer_norm.weight")) else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def hf_batch(pad_id, vocab, seed=0, batch=3, length=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(batch, length)).astype(np.int64)
    lengths = np.array([length, length - 4, 5])[:batch]
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, pad_id)
    types = (np.arange(length)[None] >= (lengths[:, None] // 2)).astype(np.int64) * mask
    return ids, types, mask


def hf_dir(tmp_path_factory, name, model):
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    return path


def assert_close(ours, theirs, mask=None, what=""):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    if mask is not None:
        ours, theirs = ours[mask.astype(bool)], theirs[mask.astype(bool)]
    err = np.max(np.abs(ours - theirs))
    assert err < TOL, f"{what}: max-abs difference {err:.2e} > {TOL}"


# ---- Chinese text (data_chinese, configs tests) ----

# A small Chinese corpus written for the tests: documents, each a list of sentences.
DOCS = [
    [
        "今天早上我们去公园散步。",
        "天气非常好，阳光照在湖面上。",
        "很多老人在树下打太极拳。",
        "孩子们在草地上放风筝。",
    ],
    [
        "我的朋友在北京大学学习计算机科学。",
        "他每天晚上都在图书馆看书。",
        "周末他喜欢和同学一起踢足球。",
    ],
    [
        "自然语言处理是人工智能的重要方向。",
        "机器翻译可以帮助人们理解外国文字。",
        "语音识别技术已经进入普通家庭。",
        "研究人员正在训练更大的语言模型。",
    ],
    ["这家餐厅的饺子非常好吃。", "服务员热情地介绍今天的特色菜。", "我们点了红烧肉和青菜豆腐汤。"],
    ["春天来了，山上的花都开了。", "农民开始在田里种水稻。", "小鸟在屋檐下建造新的鸟窝。"],
    ["火车站里人来人往，非常热闹。", "乘客们拿着行李排队上车。", "列车准时离开了城市。"],
    [
        "老师在黑板上写下今天的作业。",
        "学生们认真地记在笔记本上。",
        "下课以后大家一起讨论数学问题。",
    ],
    ["妈妈在厨房里准备晚饭。", "爸爸下班回家以后帮忙洗碗。", "全家人坐在一起看电视新闻。"],
    [
        "这座城市的博物馆收藏了很多古代文物。",
        "游客可以看到精美的瓷器和书法作品。",
        "讲解员详细介绍了历史背景。",
    ],
    ["冬天的北方经常下雪。", "孩子们在院子里堆雪人。", "大家穿着厚厚的衣服去上班。"],
    ["科学家发现了一种新的植物。", "这种植物可以在沙漠里生长。", "它的种子能够保存很多年。"],
    [
        "我们公司明年计划开发新的软件产品。",
        "工程师们正在设计用户界面。",
        "市场部门负责调查客户需求。",
    ],
]


# ---- tokenizers against transformers ----


def assert_tokenizes_as(ours, reference, texts, keys, what=""):
    """bertjax Tokenizer ``ours`` gives transformers tokenizer ``reference``'s ids of ``texts``
    (no special tokens), and `encode_pairs` rows equal its own at length 256 (longest-first
    truncation, padding), single and paired, for ``keys``; returns the reference ids.

    bertjax reads an empty second text as "no pair" (one [SEP] fewer than HF): the paired texts
    here are never empty."""
    from bertjax.tasks.tasks import encode_pairs

    expected = reference(texts, add_special_tokens=False)["input_ids"]
    assert [ids.tolist() for ids in ours.encode(texts)] == expected
    for pairs in ([""] * len(texts), [text or "-" for text in texts[::-1]]):
        rows = encode_pairs(ours, texts, pairs, 256)
        theirs = reference(
            texts,
            *([pairs] if any(pairs) else []),
            truncation=True,
            max_length=256,
            padding="max_length",
            return_tensors="np",
        )
        for key in keys:
            np.testing.assert_array_equal(rows[key], theirs[key], err_msg=f"{what} {key}")
    return expected
