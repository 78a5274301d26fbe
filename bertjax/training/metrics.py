"""Run metrics: model FLOPs and MFU, and means of fetched step metrics (where they are written:
`bertjax.training.trackers`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping

import numpy as np

from bertjax.modeling.bert_config import BertConfig

# Model FLOPs -----------------------------------------------------------------


def ffn_width(cfg: BertConfig) -> int:
    """Columns of the feed-forward's two products together: 2F, or 3F for a GLU (2F in, F out)."""
    return (3 if cfg.mlp_type == "glu" else 2) * cfg.intermediate_size


def attended_keys(cfg: BertConfig, layer: int, seq_len: int) -> int:
    """Keys a query of layer ``layer`` attends: T, or a local layer's 2h + 1 (the useful work;
    the banded path computes up to three blocks of keys, which no count includes)."""
    half = cfg.attention_window(layer)
    return min(seq_len, 2 * half + 1) if half else seq_len


def matmul_params(cfg: BertConfig) -> int:
    """Parameters that take part in one matmul per token per layer (embedding lookups excluded)."""
    h, e = cfg.hidden_size, cfg.embedding_dim
    per_layer = 4 * h * h + h * ffn_width(cfg)
    projection = e * h if e != h else 0
    return cfg.num_hidden_layers * per_layer + projection


def train_flops_per_sequence(
    cfg: BertConfig, seq_len: int, masked_per_sequence: float, last_layer_rows: int | None = None
) -> float:
    """Training FLOPs (forward + backward = 3x forward) for one sequence.

    6·N per token for the encoder's matmuls (shared ALBERT layers count once per use),
    plus attention scores and context (2 matmuls of T·K·H per layer, ×6 for fwd+bwd; K = T, or
    a local layer's window: `attended_keys`),
    plus the MLM head only at masked positions (transform H·E and decoder E·V).
    ``last_layer_rows`` (BertForPreTraining.last_layer_rows): the last layer's queries,
    attention output and feed-forward at that many rows only (its keys and values at all):
    the FLOPs the step computes, not those of a full last layer.
    """
    encoder = 6 * matmul_params(cfg) * seq_len
    keys = sum(attended_keys(cfg, layer, seq_len) for layer in range(cfg.num_hidden_layers))
    attention = 6 * 2 * keys * seq_len * cfg.hidden_size
    head = (
        6
        * masked_per_sequence
        * (cfg.hidden_size * cfg.embedding_dim + cfg.embedding_dim * cfg.vocab_size)
    )
    skipped = 0
    if last_layer_rows is not None:
        h, last = cfg.hidden_size, cfg.num_hidden_layers - 1
        rows_left_out = seq_len - min(last_layer_rows, seq_len)
        attention_row = 2 * attended_keys(cfg, last, seq_len) * h
        skipped = 6 * rows_left_out * (2 * h * h + h * ffn_width(cfg) + attention_row)
    return float(encoder + attention + head - skipped)


# Peak dense bf16 FLOP/s per chip by device kind (vendor datasheets); fp32 CPU is measured.
_PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
    "Tesla T4": 65e12,
    "NVIDIA A10G": 125e12,
}


@functools.cache
def measured_matmul_peak(dtype: str = "float32") -> float:
    """FLOP/s of one device's best of five square matmuls after two warm-up calls (2048 on a
    CPU, 8192 on an accelerator), random data. On a CPU a narrower dtype's product accumulates
    and returns float32, as BertConfig.matmul_dtype's products do. The MFU denominator where no
    datasheet peak applies. Measured once per process and dtype (~1 s on a 2-core CPU; every
    phase of a run used to pay it again)."""
    import jax
    import jax.numpy as jnp

    cpu = jax.default_backend() == "cpu"
    n = 2048 if cpu else 8192
    x = jax.random.normal(jax.random.key(0), (n, n), dtype)
    out = jnp.float32 if cpu and jnp.dtype(dtype).itemsize < 4 else None
    f = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=out))
    for _ in range(2):
        f(x).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_flops(override: float = 0.0) -> float:
    """The MFU denominator for this process's devices: ``override`` if set, else the datasheet
    peak of a known accelerator, else the measured fp32 matmul peak."""
    import jax

    return device_peak_flops(jax.devices()[0].device_kind, override) or measured_matmul_peak()


def device_peak_flops(device_kind: str, override: float = 0.0) -> float:
    """Peak FLOP/s of one device: the override if set, else a table by kind, else 0 (unknown)."""
    if override > 0:
        return override
    for kind, peak in _PEAK_FLOPS.items():
        if device_kind.startswith(kind):
            return peak
    return 0.0


def mfu(flops_per_step: float, step_seconds: float, num_devices: int, peak: float) -> float:
    if peak <= 0 or step_seconds <= 0:
        return float("nan")
    return flops_per_step / step_seconds / (num_devices * peak)


def mean_metrics(history: list[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Means over fetched per-step metric dicts (host numpy), skipping empty lists."""
    if not history:
        return {}
    return {k: float(np.mean([np.asarray(m[k], np.float64) for m in history])) for k in history[0]}
