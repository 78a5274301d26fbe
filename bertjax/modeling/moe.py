"""Mixture-of-experts feed-forward (GShard/Switch): top-k routing, capacity, auxiliary losses.

Each sequence is one routing group (G) of T tokens. A router picks k of E experts per token;
tokens take slots in an expert's buffer in priority order (all first choices, then
second choices, ...), and an expert holds at most C = ceil(capacity_factor * T * k / E)
tokens (``expert_capacity_factor=None``: C = T, nothing is dropped). Dispatch and combine
are one-hot einsums (Lepikhin et al. 2020, "GShard"), so the expert buffer
``[E, G, C, D]`` carries the logical name ``act_expert`` and `bertjax.training.sharding` splits it
over the ``expert`` mesh axis. A dropped token's MoE output is zero, so the layer's
residual passes it through unchanged. Padding tokens (from the attention mask) are not
routed: they take no capacity and are left out of the statistics.

Every MoE layer sows into the ``intermediates`` collection its router z-loss
(Zoph et al. 2022, "ST-MoE": mean of logsumexp(logits)^2), its load-balancing loss
(Fedus et al. 2021, "Switch": E * sum_i f_i * P_i per group, normalised as flaxformer's
``_load_balancing_loss``: minimum k at uniform top-k routing; see `balance_loss`), the
fraction of token-choices dropped and each expert's share of routed choices;
`collect_stats` gathers them, and `bertjax.objectives.base.Objective` adds the weighted router
losses to every objective's loss, in one place.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.layers import activation, constrain, normal_init, zeros_init

Array = jax.Array
STATS = ("z_loss", "balance_loss", "dropped_fraction", "expert_load")
# MoeFeedForward's parameters with a leading ``expert`` axis (one slice per expert).
EXPERT_PARAMS = ("intermediate_kernel", "intermediate_bias", "output_kernel", "output_bias")


def expert_capacity(cfg: BertConfig, group_size: int) -> int:
    """Slots per expert and group: ceil(capacity_factor * tokens * k / E), at most the group."""
    if cfg.expert_capacity_factor is None:
        return group_size
    wanted = math.ceil(
        cfg.expert_capacity_factor * group_size * cfg.experts_per_token / cfg.num_experts
    )
    return max(1, min(group_size, wanted))


def _router_probs(logits_GTE: Array, valid_GT: Array | None) -> tuple[Array, Array]:
    """Router probabilities and the 0/1 real-token mask (all ones when none is given)."""
    probs_GTE = jax.nn.softmax(logits_GTE, axis=-1)
    if valid_GT is None:
        valid_GT = jnp.ones(logits_GTE.shape[:2], probs_GTE.dtype)
    return probs_GTE, valid_GT.astype(probs_GTE.dtype)


def balance_loss(probs_GTE: Array, chosen_GTE: Array, valid_GT: Array) -> Array:
    """Switch's load-balancing loss (Fedus et al. 2021, eqs. 4-6) as flaxformer computes it
    (google/flaxformer architectures/moe/routing.py ``_load_balancing_loss``): per routing group,
    E * sum_e f_e * P_e with f_e the share of the group's tokens that chose expert e among their
    top k (before capacity drops) and P_e their mean router probability for e; then the mean over
    groups. sum_e f_e = k, so uniform routing gives k, its minimum. A mean over groups (rows) also
    adds up exactly over gradient-accumulation microbatches. Deliberate deviation: padding tokens
    are left out of a group's averages; flaxformer counts them in the denominators (as zeros), so
    padded groups weigh less there."""
    count_G1 = jnp.maximum(jnp.sum(valid_GT, axis=1, keepdims=True), 1.0)
    share_GE = jnp.sum(chosen_GTE * valid_GT[..., None], axis=1) / count_G1
    mean_probs_GE = jnp.sum(probs_GTE * valid_GT[..., None], axis=1) / count_G1
    return probs_GTE.shape[-1] * jnp.mean(jnp.sum(share_GE * mean_probs_GE, axis=-1))


def _router_stats(logits_GTE, probs_GTE, valid_GT, load_E, dropped_fraction, balance) -> dict:
    """STATS of one routing: z-loss, the given balancing loss, drops and ``load_E`` (each expert's
    share of the routed choices)."""
    tokens = jnp.maximum(jnp.sum(valid_GT), 1.0)
    return {
        "z_loss": jnp.sum(jax.nn.logsumexp(logits_GTE, axis=-1) ** 2 * valid_GT) / tokens,
        "balance_loss": balance,
        "dropped_fraction": dropped_fraction,
        "expert_load": load_E,
    }


def route(logits_GTE: Array, k: int, capacity: int, valid_GT: Array | None = None):
    """Top-k routing with capacity: (dispatch [G,S,E,C] 0/1, combine [G,S,E,C], stats).

    Tokens where ``valid_GT`` is 0 (padding) choose no expert and are left out of the stats.
    """
    num_experts = logits_GTE.shape[-1]
    probs_GTE, valid_GT = _router_probs(logits_GTE, valid_GT)
    remaining = probs_GTE
    choices, gates = [], []
    for _ in range(k):
        choice_GTE = (
            jax.nn.one_hot(jnp.argmax(remaining, axis=-1), num_experts, dtype=probs_GTE.dtype)
            * valid_GT[..., None]
        )
        choices.append(choice_GTE)
        gates.append(jnp.sum(probs_GTE * choice_GTE, axis=-1))
        remaining = remaining * (1.0 - choice_GTE)
    if k > 1:  # GShard: renormalize the chosen experts' gates to sum to one
        total = sum(gates)
        total = jnp.where(total > 0, total, 1.0)  # padding tokens chose nothing
        gates = [g / total for g in gates]
    dispatch = combine = 0.0
    filled_GE = jnp.zeros(probs_GTE.shape[::2], probs_GTE.dtype)  # slots taken so far
    kept = 0.0
    for choice_GTE, gate_GT in zip(choices, gates):
        # A token's slot = choices of the same expert before it in this priority round,
        # plus the slots earlier rounds took.
        slot_GTE = (jnp.cumsum(choice_GTE, axis=1) - 1.0 + filled_GE[:, None, :]) * choice_GTE
        keep_GTE = choice_GTE * (slot_GTE < capacity)
        filled_GE = filled_GE + jnp.sum(choice_GTE, axis=1)
        slots_GTEC = jax.nn.one_hot(slot_GTE.astype(jnp.int32), capacity, dtype=probs_GTE.dtype)
        routed = keep_GTE[..., None] * slots_GTEC
        dispatch = dispatch + routed
        combine = combine + gate_GT[..., None, None] * routed
        kept = kept + jnp.sum(keep_GTE)
    assignments = sum(choices)  # [G,S,E], k ones per valid token
    load_E = jnp.sum(assignments, axis=(0, 1)) / (k * jnp.maximum(jnp.sum(valid_GT), 1.0))
    dropped = 1.0 - kept / jnp.maximum(jnp.sum(assignments), 1.0)
    balance = balance_loss(probs_GTE, assignments, valid_GT)
    return (
        dispatch,
        combine,
        _router_stats(logits_GTE, probs_GTE, valid_GT, load_E, dropped, balance),
    )


def route_expert_choice(logits_GTE: Array, capacity: int, valid_GT: Array | None = None):
    """Expert-choice routing (Zhou et al. 2022): each expert takes the ``capacity`` tokens of the
    group with the highest router probability for it; (dispatch, combine, stats) as `route`.

    Every expert is full, so load is balanced by construction: no balancing loss (0, as
    flaxformer's ExpertsChooseMaskedRouter); "dropped_fraction" is the share of real tokens no
    expert took.
    Which tokens an expert takes depends on the whole sequence, which suits a bidirectional encoder.
    """
    probs_GTE, valid_GT = _router_probs(logits_GTE, valid_GT)
    scores_GET = jnp.swapaxes(jnp.where(valid_GT[..., None] > 0, probs_GTE, -1.0), 1, 2)
    top_GEC, index_GEC = jax.lax.top_k(scores_GET, capacity)
    picked_GECT = jax.nn.one_hot(index_GEC, logits_GTE.shape[1], dtype=probs_GTE.dtype)
    picked_GECT = picked_GECT * (top_GEC >= 0)[..., None]  # a padding token is never taken
    dispatch = jnp.transpose(picked_GECT, (0, 3, 1, 2))  # [G,T,E,C]
    combine = dispatch * jnp.maximum(top_GEC, 0.0)[:, None, :, :]
    load_E = jnp.sum(dispatch, axis=(0, 1, 3)) / jnp.maximum(jnp.sum(dispatch), 1.0)
    untaken = jnp.sum((jnp.sum(dispatch, axis=(2, 3)) == 0) * valid_GT)
    dropped = untaken / jnp.maximum(jnp.sum(valid_GT), 1.0)
    balance = jnp.zeros((), probs_GTE.dtype)
    return (
        dispatch,
        combine,
        _router_stats(logits_GTE, probs_GTE, valid_GT, load_E, dropped, balance),
    )


class MoeFeedForward(nn.Module):
    """E expert feed-forwards (leading ``expert`` axis) behind a top-k router."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_GTD: Array, valid_GT: Array | None = None) -> Array:
        cfg = self.cfg
        experts, width, inner = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        dtype, pdtype = cfg.compute_dtype, cfg.params_dtype
        router = self.param(
            "router_kernel", normal_init(cfg, ("embed", "expert")), (width, experts), pdtype
        )
        # The router runs in fp32: its softmax and top-k decide discrete routes.
        logits_GTE = jnp.einsum(
            "gtd,de->gte", x_GTD.astype(jnp.float32), router.astype(jnp.float32)
        )
        capacity = expert_capacity(cfg, x_GTD.shape[1])
        if cfg.moe_routing == "expert_choice":
            dispatch_GTEC, combine_GTEC, stats = route_expert_choice(logits_GTE, capacity, valid_GT)
        else:
            dispatch_GTEC, combine_GTEC, stats = route(
                logits_GTE, cfg.experts_per_token, capacity, valid_GT
            )
        self.sow("intermediates", "moe", stats)

        w_in = self.param(
            "intermediate_kernel",
            normal_init(cfg, ("expert", "embed", "mlp")),
            (experts, width, inner),
            pdtype,
        )
        b_in = self.param(
            "intermediate_bias", zeros_init(("expert", "mlp")), (experts, inner), pdtype
        )
        w_out = self.param(
            "output_kernel",
            normal_init(cfg, ("expert", "mlp", "embed")),
            (experts, inner, width),
            pdtype,
        )
        b_out = self.param("output_bias", zeros_init(("expert", "embed")), (experts, width), pdtype)
        x_EGCD = jnp.einsum("gtec,gtd->egcd", dispatch_GTEC.astype(dtype), x_GTD.astype(dtype))
        x_EGCD = constrain(x_EGCD, ("act_expert", "act_batch", None, "act_embed"))
        h_EGCF = jnp.einsum("egcd,edf->egcf", x_EGCD, w_in.astype(dtype))
        h_EGCF = activation(cfg.hidden_act)(h_EGCF + b_in.astype(dtype)[:, None, None, :])
        h_EGCF = constrain(h_EGCF, ("act_expert", "act_batch", None, "act_mlp"))
        y_EGCD = jnp.einsum("egcf,efd->egcd", h_EGCF, w_out.astype(dtype))
        y_EGCD = constrain(
            y_EGCD + b_out.astype(dtype)[:, None, None, :],
            ("act_expert", "act_batch", None, "act_embed"),
        )
        y_GTD = jnp.einsum("gtec,egcd->gtd", combine_GTEC.astype(dtype), y_EGCD)
        return constrain(y_GTD, ("act_batch", "act_len", "act_embed"))


def collect_stats(intermediates) -> dict:
    """Per-layer MoE stats sown anywhere in ``intermediates`` -> their means over MoE layers."""
    found = {name: [] for name in STATS}
    for path, leaf in jax.tree_util.tree_leaves_with_path(intermediates):
        name = getattr(path[-1], "key", None)
        if name in found:
            trailing = leaf.shape[-1:] if name == "expert_load" else ()
            found[name].append(jnp.reshape(leaf, (-1,) + trailing))
    if not found["z_loss"]:
        return {}
    return {
        name: jnp.mean(jnp.concatenate(values, axis=0), axis=0) for name, values in found.items()
    }


def aux_loss(cfg: BertConfig, stats: dict) -> Array:
    """The weighted auxiliary loss that joins the total: z-loss and load-balancing terms."""
    return (
        cfg.router_z_loss_weight * stats["z_loss"]
        + cfg.load_balance_loss_weight * stats["balance_loss"]
    )
