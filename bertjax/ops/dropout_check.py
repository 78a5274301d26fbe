"""Does an attention kernel's backward drop what its forward dropped? A deterministic check, run
by `benchmarks/gpu_suite.sh` on a GPU (its dry run here) and, on one small call, at the start of
every GPU run whose attention has dropout (`startup`).

With V one-hot over the keys (V[b, s, n, :] = e_s, head size = key count S), attention's output
*is* the dropped, scaled probabilities: O[b, t, n, s] = P'[b, n, t, s]. The gradient of
<O, dO> with respect to V is then dV[b, s, n, h] = sum_t P'[b, n, t, s] dO[b, t, n, h], which
the forward's own output gives exactly; a kernel's backward that regenerated other bits differs
in ~rate of P''s entries by O(1) (a relative error of ~0.4 at rate 0.1, against ~1e-2 for bf16
rounding). Means over draws, which a mismatched backward passes as well, are not the test.

The check runs the kernel as the step runs it (`MODES`): plainly, under remat (the forward run
again in the backward), in a microbatch loop (a `lax.scan` of two microbatches with equal inputs,
whose masks must also differ) and under GradCache (`bertjax.objectives.gradcache`: the loss sees
pass one's output, the gradient comes from pass two's backward).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("plain", "remat", "microbatches", "gradcache")
RATE = 0.1
TOLERANCE = 3e-2  # relative error of dV in bf16 (a mismatched mask: ~0.4)


@dataclasses.dataclass(frozen=True)
class Result:
    """One mode's outcome: dV's relative error, the share of dropped probabilities, whether the
    microbatches' masks differ (None: one batch), and the kernel the attention got."""

    mode: str
    error: float
    dropped: float
    masks_differ: bool | None
    kernel: str

    @property
    def ok(self) -> bool:
        dropped_ok = abs(self.dropped - RATE) < 0.05
        return self.error < TOLERANCE and dropped_ok and self.masks_differ is not False

    def line(self) -> str:
        differ = (
            "" if self.masks_differ is None else f", microbatch masks differ: {self.masks_differ}"
        )
        return (
            f"{'ok  ' if self.ok else 'FAIL'} dropout fwd/bwd agreement, {self.mode}, "
            f"{self.kernel}: dV rel error {self.error:.2e} (< {TOLERANCE}), dropped "
            f"{self.dropped:.3f} (rate {RATE}){differ}"
        )


def default_attend(implementation: str | None = None, rate: float = RATE):
    """``attend(q, k, v, key)``: attention over full rows with probability dropout at ``rate``,
    the kernel as the model chooses it (`attention_kernels.attend`; ``implementation`` forces
    one), the layer's dropout key handed over as the model hands it."""
    from bertjax.modeling import attention_kernels
    from bertjax.modeling.attention_mask import AttentionMask

    def attend(q, k, v, key):
        batch, length, heads, head_dim = q.shape
        spec = attention_kernels.AttentionSpec(
            batch, length, k.shape[1], heads, head_dim, dropout=True, dtype=str(q.dtype)
        )
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
        mask = AttentionMask.build(jnp.ones((batch, length), jnp.int32), None, positions)
        return attention_kernels.attend(spec, q, k, v, mask, key, rate, None, implementation)

    return attend


def _inputs(batch: int, length: int, heads: int, dtype, seed: int = 0):
    """Queries and keys [B, T, N, T] (logits of a few units: no probability rounds to 0), V one-hot
    over the keys, and an upstream gradient dO."""
    rng = np.random.default_rng(seed)
    shape = (batch, length, heads, length)
    q, k = (jnp.asarray(rng.normal(size=shape) * 0.3, dtype) for _ in range(2))
    v = jnp.broadcast_to(jnp.eye(length, dtype=dtype)[None, :, None, :], shape)
    d_out = jnp.asarray(rng.normal(size=shape), dtype)
    return q, k, v, d_out


def _expected_dv(out, d_out):
    """dV = P'^T dO, P' read off the forward's output (O[b, t, n, s] = P'[b, n, t, s])."""
    return jnp.einsum("btns,btnh->bsnh", out.astype(jnp.float32), d_out.astype(jnp.float32))


def _error(dv, expected) -> float:
    dv, expected = np.asarray(dv, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(dv - expected) / np.linalg.norm(expected))


def _dropped(out) -> float:
    return float(np.mean(np.asarray(out, np.float32) == 0.0))


def run_mode(mode: str, attend, batch=2, length=64, heads=2, dtype=jnp.bfloat16) -> Result:
    """The check in one of `MODES`, with ``attend(q, k, v, key)`` as the kernel under test."""
    from bertjax.modeling import attention_kernels

    q, k, v, d_out = _inputs(batch, length, heads, dtype)
    key = jax.random.key(7)
    masks_differ = None

    if mode in ("plain", "remat"):
        fn = jax.checkpoint(attend) if mode == "remat" else attend

        @jax.jit
        def program(q, k, v, d_out, key):
            out, pull = jax.vjp(lambda v: fn(q, k, v, key), v)
            return out, pull(d_out)[0]

    elif mode == "microbatches":

        @jax.jit
        def program(q, k, v, d_out, key):
            def step(_, index):  # the step's loop: a key folded per microbatch, equal inputs
                out, pull = jax.vjp(lambda v: attend(q, k, v, jax.random.fold_in(key, index)), v)
                return None, (out, pull(d_out)[0])

            return jax.lax.scan(step, None, jnp.arange(2))[1]

    elif mode == "gradcache":
        from bertjax.objectives.gradcache import gradcache_gradients

        @jax.jit
        def program(q, k, v, d_out, key):
            def embed(v_one, chunk, chunk_key):  # the encoder's stand-in: one attention call
                v_rows = jnp.broadcast_to(v_one, chunk["q"].shape)
                return attend(chunk["q"], chunk["k"], v_rows, chunk_key)

            def loss(v_one, out):  # <O, dO>, its output handed back as the aux
                return jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32)), out

            grads, out = gradcache_gradients(embed, loss, v[:1], {"q": q, "k": k}, key, batch)
            return out, grads

    else:
        raise ValueError(f"mode {mode!r}: one of {MODES}")

    with attention_kernels.recording() as record:
        out, dv = program(q, k, v, d_out, key)
    if mode == "microbatches":
        errors = [_error(dv[i], _expected_dv(out[i], d_out)) for i in range(2)]
        error = max(errors)
        masks_differ = bool(np.any((np.asarray(out[0]) == 0) != (np.asarray(out[1]) == 0)))
    elif mode == "gradcache":
        error = _error(dv[0], jnp.sum(_expected_dv(out, d_out), axis=0))
    else:
        error = _error(dv, _expected_dv(out, d_out))
    kernels = sorted({name for _, name in record})
    return Result(mode, error, _dropped(out), masks_differ, "/".join(kernels))


def check(attend=None, modes=MODES, **shapes) -> list[Result]:
    """The check in each of ``modes`` (default: the automatic kernel)."""
    attend = attend or default_attend()
    return [run_mode(mode, attend, **shapes) for mode in modes]


def _cudnn_would_serve(model_cfg) -> bool:
    """Whether the automatic choice (or the config) would give this run's attention with
    dropout to cuDNN on this GPU, before any start-up check turned it off."""
    from bertjax.modeling import attention_kernels

    if not model_cfg.attention_probs_dropout_prob:
        return False
    forced = model_cfg.attention_implementation
    if forced is not None:
        return forced == "cudnn"
    spec = attention_kernels.AttentionSpec(2, 64, 64, 2, 64, dropout=True, dtype="bfloat16")
    kernel = attention_kernels.BY_NAME["cudnn"]
    return kernel.cannot_serve(spec) is None and kernel.worth(spec)


def startup_applies(platform_name: str, model_cfg) -> bool:
    """Whether a run on ``platform_name`` with ``model_cfg`` checks cuDNN's dropout at start."""
    return platform_name in ("gpu", "cuda") and _cudnn_would_serve(model_cfg)


def startup(platform_name: str, model_cfg, attend=None) -> str | None:
    """On a GPU run whose attention would take cuDNN's dropout: the check, plain and under
    remat, on one small call. When it fails, cuDNN's dropout is turned off for the run
    (`cudnn_dropout.disable`: the exact path serves it) and the one line to print is returned;
    None otherwise. ``attend``: the kernel under test (default cuDNN's; a test hands in a
    broken one)."""
    from bertjax.ops import cudnn_dropout

    if not startup_applies(platform_name, model_cfg):
        return None
    attend = attend or default_attend("cudnn")
    try:
        results = check(attend, modes=("plain", "remat"), batch=1, length=64, heads=1)
        failed = [r for r in results if not r.ok]
        why = "; ".join(
            f"{r.mode}: dV rel error {r.error:.2g}, dropped {r.dropped:.2f}" for r in failed
        )
    except Exception as error:  # noqa: BLE001  (a cuDNN that cannot run the call at all)
        why = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    if not why:
        logging.info("attention dropout: cuDNN's backward drops what its forward dropped")
        return None
    cudnn_dropout.disable(f"cuDNN's dropout failed the start-up check ({why})")
    return (
        f"attention dropout: cuDNN's backward did not drop what its forward dropped in the "
        f"start-up check ({why}): the exact path serves attention dropout in this run"
    )
