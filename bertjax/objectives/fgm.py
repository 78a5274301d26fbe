"""FGM (Miyato et al. 2017), the fine-tuning objectives' adversarial pass: the gradient at
parameters moved by r = epsilon * g / ||g|| on one parameter (the word embeddings), added to the
clean pass's."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def fgm_perturbation(
    grads, epsilon: float, path: tuple = ("bert", "embeddings", "word_embeddings")
):
    """r = epsilon * g / ||g|| at the parameter ``path`` names (g: its gradient), 0 elsewhere."""
    node = grads
    for key in path:
        node = node[key]
    g = node
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
    r = (epsilon * g / (norm + 1e-12)).astype(g.dtype)
    return jax.tree_util.tree_map_with_path(
        lambda p, leaf: r if tuple(k.key for k in p) == tuple(path) else jnp.zeros_like(leaf),
        grads,
    )


def with_fgm(grad_fn: Callable, epsilon: float, path: tuple) -> Callable:
    """``grad_fn`` plus the gradient at parameters moved by the FGM perturbation (clean +
    adversarial, as in the usual FGM recipe); the loss sums stay the clean pass's."""

    def fgm_grad_fn(params, batch, rng):
        grads, sums = grad_fn(params, batch, rng)
        perturbed = jax.tree.map(jnp.add, params, fgm_perturbation(grads, epsilon, path))
        adversarial, _ = grad_fn(perturbed, batch, rng)
        return jax.tree.map(jnp.add, grads, adversarial), sums

    return fgm_grad_fn
