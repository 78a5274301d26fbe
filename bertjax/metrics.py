"""Run metrics: TensorBoard event files (no TensorFlow needed), metrics.jsonl, MFU.

The event file is written directly in TensorBoard's record format (length, masked
CRC-32C, serialized ``Event`` proto); the two protos used are small enough to encode
by hand, which keeps TensorFlow and protobuf code generation out of the dependencies.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import time
from collections.abc import Mapping

import numpy as np

from bertjax.config import BertConfig


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli polynomial
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:  # wire type 2: length-delimited
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(
    step: int, wall_time: float, *, file_version: str = "", scalars: Mapping[str, float] = ()
) -> bytes:
    """Serialized tensorflow.Event: wall_time=1 (double), step=2, file_version=3, summary=5."""
    out = bytes([0x09]) + struct.pack("<d", wall_time) + bytes([0x10]) + _varint(step)
    if file_version:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field_bytes(
                1, _field_bytes(1, tag.encode()) + bytes([0x15]) + struct.pack("<f", value)
            )
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, values)
    return out


class MetricWriter:
    """Scalars to a TensorBoard event file and to ``metrics.jsonl`` (process 0 only)."""

    def __init__(self, logdir: str, enabled: bool = True):
        self.enabled = enabled
        self.logdir = logdir
        if not enabled:
            return
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self._events = open(os.path.join(logdir, name), "ab")
        self._jsonl = open(os.path.join(logdir, "metrics.jsonl"), "a")
        self._write_record(_event(0, time.time(), file_version="brain.Event:2"))

    def _write_record(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._events.write(
            header
            + struct.pack("<I", _masked_crc(header))
            + data
            + struct.pack("<I", _masked_crc(data))
        )

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in scalars.items()}
        self._write_record(_event(step, time.time(), scalars=clean))
        finite = {k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}
        self._jsonl.write(json.dumps({"step": step, **finite}) + "\n")
        self.flush()

    def flush(self) -> None:
        if self.enabled:
            self._events.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            self._events.close()
            self._jsonl.close()


# Model FLOPs -----------------------------------------------------------------


def matmul_params(cfg: BertConfig) -> int:
    """Parameters that take part in one matmul per token per layer (embedding lookups excluded)."""
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.embedding_dim
    per_layer = 4 * h * h + 2 * h * i
    projection = e * h if e != h else 0
    return cfg.num_hidden_layers * per_layer + projection


def train_flops_per_sequence(
    cfg: BertConfig, seq_len: int, masked_per_sequence: float, last_layer_rows: int | None = None
) -> float:
    """Training FLOPs (forward + backward = 3x forward) for one sequence.

    6·N per token for the encoder's matmuls (shared ALBERT layers count once per use),
    plus attention scores and context (2 matmuls of T·T·H per layer, ×6 for fwd+bwd),
    plus the MLM head only at masked positions (transform H·E and decoder E·V).
    ``last_layer_rows`` (BertForPreTraining.last_layer_rows): the last layer's queries,
    attention output and feed-forward at that many rows only (its keys and values at all):
    the FLOPs the step computes, not those of a full last layer.
    """
    encoder = 6 * matmul_params(cfg) * seq_len
    attention = 6 * 2 * cfg.num_hidden_layers * seq_len * seq_len * cfg.hidden_size
    head = (
        6
        * masked_per_sequence
        * (cfg.hidden_size * cfg.embedding_dim + cfg.embedding_dim * cfg.vocab_size)
    )
    skipped = 0
    if last_layer_rows is not None:
        h, i = cfg.hidden_size, cfg.intermediate_size
        rows_left_out = seq_len - min(last_layer_rows, seq_len)
        skipped = 6 * rows_left_out * (2 * h * h + 2 * h * i + 2 * seq_len * h)
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


def measured_matmul_peak(dtype: str = "float32") -> float:
    """FLOP/s of one device's best of five square matmuls after two warm-up calls (2048 on a
    CPU, 8192 on an accelerator), random data. On a CPU a narrower dtype's product accumulates
    and returns float32, as BertConfig.matmul_dtype's products do. The MFU denominator where no
    datasheet peak applies."""
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
