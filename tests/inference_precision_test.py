"""Inference's products dtype (bertjax/inference/precision.py): "auto" takes bfloat16 for
embeddings on a CPU whose /proc/cpuinfo names AVX512-BF16 or AMX-BF16 and float32 otherwise, says
which in the log, and a forced value wins; each branch is reached by faking the CPU probe, so the
test means the same on any machine. (That the bfloat16 vectors stay within cosine 0.999 of
float32 on the real checkpoint: tests/real_checkpoint_test.py.)"""

import logging

import pytest

from bertjax.inference import precision, predictors
from bertjax.inference.embedder import Embedder
from bertjax.modeling.bert_config import BertConfig

INTEL = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu avx2 fma\n"


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    """Each test sees its choices logged (the module logs a choice once per process)."""
    monkeypatch.setattr(precision, "_logged", set())


@pytest.mark.parametrize(
    "cpuinfo,want",
    [(INTEL, ("avx512_bf16", "amx_bf16")), (ZEN3, ()), (None, ())],
    ids=["sapphire_rapids", "zen3", "no_cpuinfo"],
)
def test_the_probe_reads_the_cpu_flags(cpuinfo, want, tmp_path):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:  # None: no such file (not Linux)
        path.write_text(cpuinfo)
    assert precision.cpu_bf16_flags(str(path)) == want


def _cpu_with(monkeypatch, cpuinfo: str, tmp_path):
    """This process's CPU probe reads ``cpuinfo`` instead of the machine's."""
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(precision, "CPUINFO", str(path))
    monkeypatch.setattr(precision.platform, "on_cpu", lambda: True)


def test_auto_takes_bfloat16_for_embeddings_where_the_cpu_has_it(monkeypatch, tmp_path, caplog):
    _cpu_with(monkeypatch, INTEL, tmp_path)
    with caplog.at_level(logging.INFO):
        assert precision.matmul_dtype("auto", "embed") == "bfloat16"
        assert precision.matmul_dtype("auto", "classify") is None  # labels: float32
        assert precision.matmul_dtype("float32", "embed") is None  # the override wins
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "inference products in bfloat16 (auto: this CPU has avx512_bf16, amx_bf16; "
        "--matmul_dtype=float32 for the other)",
        "inference products in float32 (auto: classify outputs are checked in float32 only; "
        "--matmul_dtype=bfloat16 for the other)",
        "inference products in float32 (as asked; --matmul_dtype=bfloat16 for the other)",
    ]
    cfg = BertConfig.preset("tiny")
    assert Embedder(cfg, {}, tokenizer=None).cfg.matmul_dtype == "bfloat16"
    assert Embedder(cfg, {}, tokenizer=None, matmul_dtype="float32").cfg.matmul_dtype is None


def test_auto_keeps_float32_where_the_cpu_lacks_it(monkeypatch, tmp_path, caplog):
    _cpu_with(monkeypatch, ZEN3, tmp_path)
    with caplog.at_level(logging.INFO):
        assert precision.matmul_dtype("auto", "embed") is None
        assert precision.matmul_dtype("bfloat16", "fill_mask") == "bfloat16"  # as asked
    assert caplog.records[0].getMessage() == (
        "inference products in float32 (auto: this CPU has none of avx512_bf16, amx_bf16; "
        "--matmul_dtype=bfloat16 for the other)"
    )
    cfg = BertConfig.preset("tiny", matmul_dtype="bfloat16")  # as a bf16 training run saved it
    assert Embedder(cfg, {}, tokenizer=None).cfg.matmul_dtype is None
    predictor = predictors.Classifier(cfg, {}, None, 16, ["a", "b"], matmul_dtype="bfloat16")
    assert predictor.cfg.matmul_dtype == "bfloat16"


def test_auto_keeps_float32_off_the_cpu(monkeypatch, tmp_path):
    _cpu_with(monkeypatch, INTEL, tmp_path)
    monkeypatch.setattr(precision.platform, "on_cpu", lambda: False)
    monkeypatch.setattr(precision.platform, "name", lambda: "gpu")
    assert precision.matmul_dtype("auto", "embed") is None


def test_an_unknown_dtype_names_the_flag():
    with pytest.raises(ValueError, match=r"--matmul_dtype='fp16': one of \('auto'"):
        precision.matmul_dtype("fp16")


def test_kernels_are_stored_in_the_products_dtype():
    """Dense kernels (leaves named *kernel) take the products' dtype; biases, norms and
    embedding tables keep theirs; float32 products leave the tree as it is."""
    import numpy as np

    params = {
        "embeddings": {"word_embeddings": np.ones((8, 4), np.float32)},
        "layer": {
            "attention": {"query_kernel": np.ones((4, 2, 2), np.float32)},
            "mlp": {"kernel": np.ones((4, 8), np.float32), "bias": np.ones(8, np.float32)},
        },
    }
    stored = precision.stored_for(params, "bfloat16")
    assert stored["layer"]["attention"]["query_kernel"].dtype == np.dtype("bfloat16")
    assert stored["layer"]["mlp"]["kernel"].dtype == np.dtype("bfloat16")
    assert stored["layer"]["mlp"]["bias"].dtype == np.float32
    assert stored["embeddings"]["word_embeddings"].dtype == np.float32
    assert precision.stored_for(params, None) is params
