"""Attention as a table of kernels chosen by what they support.

`AttentionSpec` describes the attention to compute (shapes, and features such as a local window,
a causal mask, packed rows, gathered query rows, dropout, and room for a logit bias, a soft-cap
and grouped key/value heads). Each `Kernel` names the features it serves; a feature at a
non-default value that a kernel has not listed rules it out, so a new feature is served by the
exact path alone, on every platform, until a fast kernel opts in (correct first, fast later).

`choose` takes the first kernel in `KERNELS` that runs on this platform, serves the description
and is worth it at these shapes; ``BertConfig.attention_implementation`` forces one by name
(`KERNEL_NAMES`) and raises naming the kernel and what it cannot serve. The choice is logged once
per description.

Where the CPU leaves the dense path (benchmarks/step/attention_cpu.py --long; docs/results/step.md):
local layers take the banded path in blocks of max(half-window, LOCAL_BLOCK) rows from
LOCAL_FROM_BLOCKS blocks on, global layers the blocked one from FLASH_FROM keys, in key blocks
of FLASH_BLOCK (banded beats dense from T=512; blocked takes less memory from T=1024 but is only
faster from T=4096, and this path is for speed).

On a TPU, splash where it serves; attention with dropout by `flash_dropout` (bertjax/ops/
flash_dropout.py), which regenerates its keep-bits from the layer's seed instead of storing a
[B, N, T, S] mask: its bits are `keep_bits`' hash, not the exact path's `keep_mask` (the same
distribution; a check against the exact path hands it those bits, `keep_bits.dense`).

On a GPU, cuDNN's flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`) where
it serves: bf16/fp16 queries, padded (not packed or gathered) rows, global or causal-local
layers, and the cuDNN library installed; XLA's fused attention elsewhere. With probability
dropout (BERT's training steps) cuDNN draws the bits itself (`bertjax.ops.cudnn_dropout`: a
private JAX call, bits not from the step's key, refused in scanned or shared stacks); the exact
path, which writes the scores to HBM, serves the rest. Not measured here (no GPU): the choice
follows JAX's documentation, where cuDNN is the fast path on NVIDIA GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from bertjax.modeling.attention_mask import AttentionMask
from bertjax.ops import attention as attention_ops
from bertjax.ops import blocked_attention as blocked
from bertjax.ops import cudnn_dropout, flash_dropout, keep_bits, platform, splash
from bertjax.ops.elementwise import keep_mask

Array = jax.Array

LOCAL_BLOCK = 64
LOCAL_FROM_BLOCKS = 4
FLASH_FROM = 4096
FLASH_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """The attention to compute, static (hashable): shapes, then features. A feature at its
    default asks nothing of a kernel; at another value only kernels that list it serve it."""

    batch: int
    query_length: int  # T (the gathered rows' count when gathered_rows)
    key_length: int  # S
    heads: int  # N, query heads
    head_dim: int  # H
    half_window: int = 0  # > 0: a local layer, keys within this distance of the query
    causal: bool = False  # no key after its query (positions within a segment)
    packed: bool = False  # several segments per row (segment ids, not only padding)
    gathered_rows: bool = False  # queries at some rows only (a sparse last layer)
    dropout: bool = False  # probability dropout (a keep mask [B, N, T, S])
    bias: bool = False  # an additive logit bias, broadcastable to [B, N, T, S]
    soft_cap: float = 0.0  # > 0: logits become soft_cap * tanh(logits / soft_cap)
    kv_groups: int = 1  # query heads per key/value head (grouped-query attention)
    dtype: str = ""  # the queries' dtype ("bfloat16", ...; "" unknown): not a feature

    def features(self) -> tuple[str, ...]:
        """The feature fields set to something other than their default."""
        return tuple(
            f.name
            for f in dataclasses.fields(self)
            if f.name not in SHAPES and getattr(self, f.name) != f.default
        )


SHAPES = ("batch", "query_length", "key_length", "heads", "head_dim", "dtype")
FEATURES = tuple(f.name for f in dataclasses.fields(AttentionSpec) if f.name not in SHAPES)
# The features `describe` puts in words of their own (the layer's reach, the query rows); every
# other feature reads as its name (a flag) or ``name=value``, so a new one shows in every report.
_WORDED = ("half_window", "gathered_rows")


def describe(spec: AttentionSpec) -> str:
    """``spec`` in words, every feature it sets included: "global, T=128, causal, packed",
    "local 257, gathered rows, soft_cap=30.0" (`bertjax.compile`'s report, train.py's line)."""
    words = [f"local {2 * spec.half_window + 1}" if spec.half_window else "global"]
    words.append("gathered rows" if spec.gathered_rows else f"T={spec.query_length}")
    for name in spec.features():
        if name not in _WORDED:
            value = getattr(spec, name)
            words.append(name if value is True else f"{name}={value!r}")
    return ", ".join(words)


def exact_attention(
    q_BTNH: Array,
    k_BSKH: Array,
    v_BSKH: Array,
    mask: Array,
    keep: Array | None = None,
    rate: float = 0.0,
    bias: Array | None = None,
    soft_cap: float = 0.0,
) -> Array:
    """Softmax attention in fp32 under autodiff, the reference every kernel is tested against:
    ``mask`` boolean, broadcastable to [B, N, T, S]; ``keep`` (boolean [B, N, T, S]) and
    ``rate``: dropout on the probabilities; ``bias`` added to the scaled logits; ``soft_cap``
    > 0 caps them by tanh; keys and values with fewer heads (K) than the queries serve N / K
    query heads each."""
    groups = q_BTNH.shape[2] // k_BSKH.shape[2]
    if groups > 1:
        k_BSKH, v_BSKH = (jnp.repeat(a, groups, axis=2) for a in (k_BSKH, v_BSKH))
    logits_BNTS = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSKH).astype(jnp.float32)
    logits_BNTS = logits_BNTS / jnp.sqrt(jnp.float32(q_BTNH.shape[-1]))
    if soft_cap:
        logits_BNTS = soft_cap * jnp.tanh(logits_BNTS / soft_cap)
    if bias is not None:
        logits_BNTS = logits_BNTS + bias.astype(jnp.float32)
    probs_BNTS = jax.nn.softmax(jnp.where(mask, logits_BNTS, jnp.finfo(jnp.float32).min), axis=-1)
    if keep is not None:
        probs_BNTS = jnp.where(keep, probs_BNTS / (1.0 - rate), 0.0)
    return jnp.einsum("bnts,bsnh->btnh", probs_BNTS.astype(v_BSKH.dtype), v_BSKH)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One way to compute attention. ``serves``: the features it computes (None: every one, the
    exact reference's promise: a new feature is implemented there first); ``platforms``: where
    the automatic choice may take it (a forced kernel runs anywhere); ``limit``: why else it
    cannot serve a description (None: it can); ``worth``: whether the automatic choice should
    take it at these shapes (measured faster); ``run(spec, q, k, v, mask, keep, rate, bias)``;
    ``draw_keep(spec, key, rate)``: the ``keep`` it takes, drawn from the layer's dropout key
    (a dense keep mask, or what the kernel regenerates the bits from)."""

    name: str
    serves: frozenset | None
    platforms: tuple
    run: Callable
    limit: Callable = lambda spec: None
    worth: Callable = lambda spec: True
    draw_keep: Callable = lambda spec, key, rate: keep_mask(
        key, (spec.batch, spec.heads, spec.query_length, spec.key_length), 1.0 - rate
    )

    def cannot_serve(self, spec: AttentionSpec) -> str | None:
        """The first reason this kernel cannot compute ``spec`` (None: it can)."""
        for feature in spec.features():
            if self.serves is not None and feature not in self.serves:
                return f"{feature}={getattr(spec, feature)!r}"
        return self.limit(spec)


def _exact(spec, q, k, v, mask, keep, rate, bias):
    dense = mask.dense(spec.half_window, spec.causal)
    return exact_attention(q, k, v, dense, keep, rate, bias, spec.soft_cap)


def _cpu_dense(spec, q, k, v, mask, keep, rate, bias):
    dense = mask.dense(spec.half_window, spec.causal)
    chains = attention_ops.cpu_chains(spec.batch)
    return attention_ops.attention(q, k, v, dense, keep, rate, chains)


def _local_block(spec) -> int:
    return max(spec.half_window, LOCAL_BLOCK)


def _cpu_banded(spec, q, k, v, mask, keep, rate, bias):
    return blocked.local_attention(
        q,
        k,
        v,
        mask.query_segments,
        mask.key_segments,
        mask.key_positions,
        spec.half_window,
        _local_block(spec),
        attention_ops.cpu_chains(spec.batch),
        causal=spec.causal,
    )


def _cpu_blocked(spec, q, k, v, mask, keep, rate, bias):
    return blocked.flash_attention(
        q,
        k,
        v,
        mask.query_segments,
        mask.key_segments,
        mask.query_positions,
        mask.key_positions,
        spec.half_window,
        FLASH_BLOCK,
        causal=spec.causal,
    )


def _activation_partition() -> PartitionSpec | None:
    """The [B, T, N, H] activations' sharding on the mesh being compiled for (from the logical
    axis rules in force), or None outside a mesh: a Mosaic kernel runs inside ``shard_map``."""
    if jax.sharding.get_abstract_mesh().empty:
        return None
    return nn.logical_to_mesh_axes(("act_batch", "act_len", "act_heads", "act_kv"))


def _splash(spec, q, k, v, mask, keep, rate, bias):
    interpret = platform.current() != "tpu"  # forced elsewhere (the tests): Pallas interpret
    return splash.attention(
        q,
        k,
        v,
        mask.query_segments,
        mask.key_segments,
        spec.half_window,
        interpret=interpret,
        causal=spec.causal,
        partition=_activation_partition(),
    )


def _flash_dropout(spec, q, k, v, mask, keep, rate, bias):
    if keep is not None and keep.dtype == jnp.bool_:
        raise ValueError("the flash_dropout kernel draws its own keep-bits: pass the dropout key")
    rows = (mask.query_segments, mask.key_segments, mask.query_positions, mask.key_positions)
    interpret = platform.current() != "tpu"  # forced elsewhere (the tests): Pallas interpret
    partition = _activation_partition()
    half, causal = spec.half_window, spec.causal
    return flash_dropout.attention(q, k, v, *rows, keep, rate, half, causal, interpret, partition)


def _fused(implementation):
    """`jax.nn.dot_product_attention` (XLA or cuDNN): padded rows by their lengths, read as
    right-padded as the pipeline and transformers pad; packed or gathered rows by a mask."""

    def run(spec, q, k, v, mask, keep, rate, bias):
        half = spec.half_window
        window = None
        if half and not spec.gathered_rows:
            window = (half, 0 if spec.causal else half)
        kwargs = {}
        if spec.packed or spec.gathered_rows:
            dense = mask.dense(0 if window else half, spec.causal)
            shape = (dense.shape[0], 1, spec.query_length, spec.key_length)
            kwargs["mask"] = jnp.broadcast_to(dense, shape)
        else:
            lengths = jnp.sum(mask.key_segments > 0, axis=-1).astype(jnp.int32)
            kwargs.update(query_seq_lengths=lengths, key_value_seq_lengths=lengths)
            if spec.causal:
                kwargs["is_causal"] = True
        return jax.nn.dot_product_attention(
            q, k, v, local_window_size=window, implementation=implementation, **kwargs
        )

    return run


def _cudnn(spec, q, k, v, mask, keep, rate, bias):
    """cuDNN's flash attention: `jax.nn.dot_product_attention`, or with dropout the call below
    it (`bertjax.ops.cudnn_dropout`: cuDNN draws the bits; ``keep`` goes unused)."""
    if keep is None:
        return _fused("cudnn")(spec, q, k, v, mask, keep, rate, bias)
    if spec.packed or spec.gathered_rows:
        dense = mask.dense(spec.half_window, spec.causal)
        return cudnn_dropout.attention(q, k, v, rate, mask=dense)
    lengths = cudnn_dropout.lengths(mask.key_segments)
    return cudnn_dropout.attention(q, k, v, rate, lengths, spec.causal, spec.half_window)


def _cudnn_limit(spec):
    """What cuDNN's flash attention (through `jax.nn.dot_product_attention`) cannot compute."""
    if spec.head_dim > 256 or spec.head_dim % 8:
        return f"head_dim={spec.head_dim} (cuDNN: a multiple of 8, at most 256)"
    if spec.half_window and not spec.causal:
        return "a two-sided local window (cuDNN's sliding window looks left only)"
    odd = spec.query_length % 2 or spec.key_length % 2
    if spec.dropout and (spec.packed or spec.gathered_rows) and odd:
        return f"dropout with a mask over {spec.query_length} x {spec.key_length} (cuDNN: even)"
    return cudnn_dropout.refusal() if spec.dropout else None


@functools.cache
def _cudnn_installed() -> bool:
    try:  # JAX asks the cuDNN library for its version when it traces the call
        from jax._src.cudnn.fused_attention_stablehlo import check_cudnn_version

        check_cudnn_version()
        return True
    except Exception:  # noqa: BLE001  (no cuDNN, or no CUDA plugin)
        return False


def _cudnn_worth(spec) -> bool:
    """The automatic choice takes cuDNN for bf16/fp16 queries (its flash attention's inputs) in
    padded rows (lengths, not a mask) where the library is installed; packed or gathered rows
    would reach it as a dense bias."""
    half = spec.dtype in ("bfloat16", "float16")
    return half and not (spec.packed or spec.gathered_rows) and _cudnn_installed()


def _needs_local(spec):
    return None if spec.half_window else "half_window=0 (banded attention is for local layers)"


_MASKING = frozenset({"half_window", "causal", "packed"})
ALL_PLATFORMS = ("cpu", "gpu", "tpu")

# The automatic choice tries these in order; the exact path, last, serves every description.
KERNELS: tuple[Kernel, ...] = (
    Kernel(
        "cpu_banded",
        _MASKING,
        ("cpu",),
        _cpu_banded,
        limit=_needs_local,
        worth=lambda spec: spec.key_length >= LOCAL_FROM_BLOCKS * _local_block(spec),
    ),
    Kernel(
        "cpu_blocked",
        _MASKING | {"gathered_rows"},
        ("cpu",),
        _cpu_blocked,
        worth=lambda spec: spec.key_length >= FLASH_FROM,
    ),
    Kernel("cpu_dense", _MASKING | {"gathered_rows", "dropout"}, ("cpu",), _cpu_dense),
    Kernel("splash", _MASKING, ("tpu",), _splash),
    Kernel(
        "flash_dropout",
        _MASKING | {"gathered_rows", "dropout"},
        ("tpu",),
        _flash_dropout,
        worth=lambda spec: spec.dropout,  # splash and fused attention serve the rest
        draw_keep=lambda spec, key, rate: keep_bits.seed_words(key),
    ),
    Kernel(
        "cudnn",
        _MASKING | {"gathered_rows", "dropout"},
        ("gpu",),
        _cudnn,
        limit=_cudnn_limit,
        worth=_cudnn_worth,
        draw_keep=lambda spec, key, rate: key,  # cuDNN draws its own bits: nothing to draw
    ),
    Kernel("fused", _MASKING | {"gathered_rows"}, ("gpu", "tpu"), _fused(None)),
    Kernel("xla", _MASKING | {"gathered_rows"}, (), _fused("xla")),  # forced only
    Kernel("exact", None, ALL_PLATFORMS, _exact),
)
KERNEL_NAMES = tuple(kernel.name for kernel in KERNELS)
BY_NAME = {kernel.name: kernel for kernel in KERNELS}
_logged: set = set()
_recorders: list = []


@contextlib.contextmanager
def recording():
    """Yields a list that collects (spec, kernel name) of every attention traced inside the
    block (the kernel each layer got, for `python -m bertjax.compile`)."""
    record: list = []
    _recorders.append(record)
    try:
        yield record
    finally:
        _recorders.remove(record)


def summary(record: list) -> dict[str, int]:
    """{"kernel: description": count} of a `recording` (one count per attention traced)."""
    counts: dict[str, int] = {}
    for spec, name in record:
        key = f"{name}: {describe(spec)}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def choose(spec: AttentionSpec, implementation: str | None = None) -> Kernel:
    """The kernel that computes ``spec``: ``implementation`` when named (raising if it cannot
    serve ``spec``), else the first in `KERNELS` for this platform that serves it and is worth
    it at these shapes."""
    if implementation is not None:
        if implementation not in BY_NAME:
            raise ValueError(
                f"BertConfig.attention_implementation={implementation!r}: not a kernel; "
                f"known: {KERNEL_NAMES}"
            )
        kernel = BY_NAME[implementation]
        reason = kernel.cannot_serve(spec)
        if reason is not None:
            raise ValueError(
                f"BertConfig.attention_implementation={implementation!r}: the {kernel.name} "
                f"kernel cannot serve {reason} ({spec}); leave attention_implementation unset "
                "to choose a kernel that can"
            )
        return kernel
    where = platform.current()
    return next(
        kernel
        for kernel in KERNELS
        if where in kernel.platforms and kernel.cannot_serve(spec) is None and kernel.worth(spec)
    )


def attend(
    spec: AttentionSpec,
    q_BTNH: Array,
    k_BSNH: Array,
    v_BSNH: Array,
    mask: AttentionMask,
    keep: Array | None = None,
    rate: float = 0.0,
    bias: Array | None = None,
    implementation: str | None = None,
) -> Array:
    """Softmax attention [B, T, N, H] as ``spec`` describes, by the kernel `choose` picks
    (logged once per description). ``keep``: the dropout's keep mask, or the layer's dropout
    key (a PRNG key), drawn here in the form the chosen kernel takes (`Kernel.draw_keep`)."""
    kernel = choose(spec, implementation)
    if keep is not None and jax.dtypes.issubdtype(keep.dtype, jax.dtypes.prng_key):
        keep = kernel.draw_keep(spec, keep, rate)
    for record in _recorders:
        record.append((spec, kernel.name))
    if (kernel.name, spec) not in _logged:
        _logged.add((kernel.name, spec))
        logging.info("attention: the %s kernel for %s", kernel.name, spec)
    return kernel.run(spec, q_BTNH, k_BSNH, v_BSNH, mask, keep, rate, bias)
