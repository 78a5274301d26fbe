"""Cross-entropy with a hand-written backward (softmax minus one-hot in one pass) and the
argmax correctness that rides along, as a masked max."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops import platform

Array = jax.Array


def nll(logits: Array, labels: Array) -> Array:
    """-log softmax(logits)[label] as logsumexp minus the label's logit, in fp32 ([..., C] x
    [...]; the logits in any float dtype): with a hand-written backward on XLA:CPU and GPUs,
    autodiff's on TPUs. XLA:GPU does not fuse autodiff's backward (the label's term is a
    scatter-add into an fp32 [rows, C] of zeros, then a separate pass for the softmax); the
    hand-written one reads the logits and writes their gradient once, in the logits' dtype,
    keeping the logits (not an fp32 copy) for the backward (BERT-base seq128 compiled for h100-8:
    16.99 -> 16.70 GiB of HBM traffic a step, docs/results/compile.md). The same formula either
    way: softmax(logits) - one_hot(label), times the incoming gradient."""
    if platform.current() != "tpu":
        return _nll(logits, labels)
    logits = logits.astype(jnp.float32)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - label_logit


@jax.custom_vjp
def _nll(logits: Array, labels: Array) -> Array:
    return _nll_fwd(logits, labels)[0]


def _nll_fwd(logits, labels):
    x = logits.astype(jnp.float32)
    top = jnp.max(x, axis=-1, keepdims=True)
    log_sum_exp = jnp.log(jnp.sum(jnp.exp(x - top), axis=-1)) + top[..., 0]
    label_logit = jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0]
    return log_sum_exp - label_logit, (logits, labels, log_sum_exp)


def _nll_bwd(residuals, g):
    """(softmax - one_hot(label)) * g in one pass over the logits (autodiff's two terms, a
    scatter-add of the label's and a separate sum, cost two more), in the logits' dtype."""
    logits, labels, log_sum_exp = residuals
    x = logits.astype(jnp.float32)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    probs = jnp.exp(x - log_sum_exp[..., None])
    grad = (probs - (index == labels[..., None]).astype(jnp.float32)) * g[..., None]
    return grad.astype(logits.dtype), None


_nll.defvjp(_nll_fwd, _nll_bwd)


def cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-example fp32 cross-entropy and correctness of the argmax: [..., C] x [...] -> [...].

    On XLA:CPU and GPUs the loss has a hand-written backward (`nll`): its autodiff of
    log_softmax + take and jnp.argmax (a two-value reduction) cost more at a BERT vocabulary.
    Correct means jnp.argmax's answer (the first position holding the maximum) is the label: the
    label's logit is the maximum and every logit before it is below that, a masked max reduction
    (cheaper on XLA:CPU than the first-max index as a min over positions).
    """
    labels = labels.astype(jnp.int32)
    nll_ = nll(logits, labels)
    logits = jax.lax.stop_gradient(logits).astype(jnp.float32)
    top = jnp.max(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    before_label = jnp.max(jnp.where(index < labels[..., None], logits, -jnp.inf), axis=-1)
    return nll_, ((label_logit >= top) & (before_label < top)).astype(jnp.float32)
