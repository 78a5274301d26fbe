"""Cross-entropy with a hand-written backward (softmax minus one-hot in one pass) and the
argmax correctness that rides along, as a masked max."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops import platform

Array = jax.Array


def nll(logits: Array, labels: Array) -> Array:
    """-log softmax(logits)[label] as logsumexp minus the label's logit (fp32 [..., C] x [...]);
    with a hand-written backward on XLA:CPU, autodiff's elsewhere (XLA fuses it)."""
    if platform.on_cpu():
        return _nll(logits, labels)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - label_logit


@jax.custom_vjp
def _nll(logits: Array, labels: Array) -> Array:
    return _nll_fwd(logits, labels)[0]


def _nll_fwd(logits, labels):
    top = jnp.max(logits, axis=-1, keepdims=True)
    log_sum_exp = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1)) + top[..., 0]
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return log_sum_exp - label_logit, (logits, labels, log_sum_exp)


def _nll_bwd(residuals, g):
    """(softmax - one_hot(label)) * g in one pass over the logits (autodiff's two terms, a
    scatter-add of the label's and a separate sum, cost two more)."""
    logits, labels, log_sum_exp = residuals
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    probs = jnp.exp(logits - log_sum_exp[..., None])
    return (probs - (index == labels[..., None]).astype(logits.dtype)) * g[..., None], None


_nll.defvjp(_nll_fwd, _nll_bwd)


def cross_entropy(logits: Array, labels: Array) -> tuple[Array, Array]:
    """Per-example fp32 cross-entropy and correctness of the argmax: [..., C] x [...] -> [...].

    On XLA:CPU the loss has a hand-written backward (`nll`): its autodiff of log_softmax + take and
    jnp.argmax (a two-value reduction) cost more at a BERT vocabulary. Correct means jnp.argmax's
    answer (the first position holding the maximum) is the label: the label's logit is the maximum
    and every logit before it is below that, a masked max reduction (cheaper on XLA:CPU than the
    first-max index as a min over positions).
    """
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.int32)
    nll_ = nll(logits, labels)
    logits = jax.lax.stop_gradient(logits)
    top = jnp.max(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    before_label = jnp.max(jnp.where(index < labels[..., None], logits, -jnp.inf), axis=-1)
    return nll_, ((label_logit >= top) & (before_label < top)).astype(jnp.float32)
