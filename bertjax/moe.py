"""Mixture-of-experts feed-forward (GShard/Switch): top-k routing, capacity, auxiliary losses.

Each sequence is one routing group of S tokens. A router picks k of E experts per token;
tokens take slots in an expert's buffer in priority order (all first choices, then
second choices, ...), and an expert holds at most C = ceil(capacity_factor * S * k / E)
tokens (``expert_capacity_factor=None``: C = S, nothing is dropped). Dispatch and combine
are one-hot einsums (Lepikhin et al. 2020, "GShard"), so the expert buffer
``[E, G, C, M]`` carries the logical name ``act_expert`` and `bertjax.sharding` splits it
over the ``expert`` mesh axis. A dropped token's MoE output is zero, so the layer's
residual passes it through unchanged. Padding tokens (from the attention mask) are not
routed: they take no capacity and are left out of the statistics.

Every MoE layer sows into the ``intermediates`` collection its router z-loss
(Zoph et al. 2022, "ST-MoE": mean of logsumexp(logits)^2), its load-balancing loss
(Fedus et al. 2021, "Switch": E * sum_i f_i * P_i, minimum 1 at uniform routing), the
fraction of token-choices dropped and each expert's share of routed choices.
`apply_model` collects them; `loss_sums` / `metrics` turn them into additive sums.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.config import BertConfig
from bertjax.model import BertLayer, _init, _zeros, activation, constrain

Array = jax.Array
STATS = ("z_loss", "balance_loss", "dropped_fraction", "expert_load")


def expert_capacity(cfg: BertConfig, group_size: int) -> int:
    """Slots per expert and group: ceil(capacity_factor * tokens * k / E), at most the group."""
    if cfg.expert_capacity_factor is None:
        return group_size
    wanted = math.ceil(
        cfg.expert_capacity_factor * group_size * cfg.experts_per_token / cfg.num_experts
    )
    return max(1, min(group_size, wanted))


def _router_probs(logits_GSE: Array, valid_GS: Array | None) -> tuple[Array, Array]:
    """Router probabilities and the 0/1 real-token mask (all ones when none is given)."""
    probs_GSE = jax.nn.softmax(logits_GSE, axis=-1)
    if valid_GS is None:
        valid_GS = jnp.ones(logits_GSE.shape[:2], probs_GSE.dtype)
    return probs_GSE, valid_GS.astype(probs_GSE.dtype)


def _router_stats(logits_GSE, probs_GSE, valid_GS, load_E, dropped_fraction) -> dict:
    """STATS of one routing: z-loss and the Switch balancing loss E * sum_i f_i * P_i, with f_i =
    ``load_E`` (share of routed choices per expert) and P_i the mean router probability."""
    tokens = jnp.maximum(jnp.sum(valid_GS), 1.0)
    mean_probs_E = jnp.sum(probs_GSE * valid_GS[..., None], axis=(0, 1)) / tokens
    return {
        "z_loss": jnp.sum(jax.nn.logsumexp(logits_GSE, axis=-1) ** 2 * valid_GS) / tokens,
        "balance_loss": logits_GSE.shape[-1] * jnp.sum(load_E * mean_probs_E),
        "dropped_fraction": dropped_fraction,
        "expert_load": load_E,
    }


def route(logits_GSE: Array, k: int, capacity: int, valid_GS: Array | None = None):
    """Top-k routing with capacity: (dispatch [G,S,E,C] 0/1, combine [G,S,E,C], stats).

    Tokens where ``valid_GS`` is 0 (padding) choose no expert and are left out of the stats.
    """
    num_experts = logits_GSE.shape[-1]
    probs_GSE, valid_GS = _router_probs(logits_GSE, valid_GS)
    remaining = probs_GSE
    choices, gates = [], []
    for _ in range(k):
        choice_GSE = (
            jax.nn.one_hot(jnp.argmax(remaining, axis=-1), num_experts, dtype=probs_GSE.dtype)
            * valid_GS[..., None]
        )
        choices.append(choice_GSE)
        gates.append(jnp.sum(probs_GSE * choice_GSE, axis=-1))
        remaining = remaining * (1.0 - choice_GSE)
    if k > 1:  # GShard: renormalize the chosen experts' gates to sum to one
        total = sum(gates)
        total = jnp.where(total > 0, total, 1.0)  # padding tokens chose nothing
        gates = [g / total for g in gates]
    dispatch = combine = 0.0
    filled_GE = jnp.zeros(probs_GSE.shape[::2], probs_GSE.dtype)  # slots taken so far
    kept = 0.0
    for choice_GSE, gate_GS in zip(choices, gates):
        # A token's slot = choices of the same expert before it in this priority round,
        # plus the slots earlier rounds took.
        slot_GSE = (jnp.cumsum(choice_GSE, axis=1) - 1.0 + filled_GE[:, None, :]) * choice_GSE
        keep_GSE = choice_GSE * (slot_GSE < capacity)
        filled_GE = filled_GE + jnp.sum(choice_GSE, axis=1)
        slots_GSEC = jax.nn.one_hot(slot_GSE.astype(jnp.int32), capacity, dtype=probs_GSE.dtype)
        routed = keep_GSE[..., None] * slots_GSEC
        dispatch = dispatch + routed
        combine = combine + gate_GS[..., None, None] * routed
        kept = kept + jnp.sum(keep_GSE)
    assignments = sum(choices)  # [G,S,E], k ones per valid token
    load_E = jnp.sum(assignments, axis=(0, 1)) / (k * jnp.maximum(jnp.sum(valid_GS), 1.0))
    dropped = 1.0 - kept / jnp.maximum(jnp.sum(assignments), 1.0)
    return dispatch, combine, _router_stats(logits_GSE, probs_GSE, valid_GS, load_E, dropped)


def route_expert_choice(logits_GSE: Array, capacity: int, valid_GS: Array | None = None):
    """Expert-choice routing (Zhou et al. 2022): each expert takes the ``capacity`` tokens of the
    group with the highest router probability for it; (dispatch, combine, stats) as `route`.

    Every expert is full, so load is balanced by construction (the balancing loss is 1, its
    minimum, and has no gradient); "dropped_fraction" is the share of real tokens no expert took.
    Which tokens an expert takes depends on the whole sequence, which suits a bidirectional encoder.
    """
    probs_GSE, valid_GS = _router_probs(logits_GSE, valid_GS)
    scores_GES = jnp.swapaxes(jnp.where(valid_GS[..., None] > 0, probs_GSE, -1.0), 1, 2)
    top_GEC, index_GEC = jax.lax.top_k(scores_GES, capacity)
    picked_GECS = jax.nn.one_hot(index_GEC, logits_GSE.shape[1], dtype=probs_GSE.dtype)
    picked_GECS = picked_GECS * (top_GEC >= 0)[..., None]  # a padding token is never taken
    dispatch = jnp.transpose(picked_GECS, (0, 3, 1, 2))  # [G,S,E,C]
    combine = dispatch * jnp.maximum(top_GEC, 0.0)[:, None, :, :]
    load_E = jnp.sum(dispatch, axis=(0, 1, 3)) / jnp.maximum(jnp.sum(dispatch), 1.0)
    untaken = jnp.sum((jnp.sum(dispatch, axis=(2, 3)) == 0) * valid_GS)
    dropped = untaken / jnp.maximum(jnp.sum(valid_GS), 1.0)
    return dispatch, combine, _router_stats(logits_GSE, probs_GSE, valid_GS, load_E, dropped)


class MoeFeedForward(nn.Module):
    """E expert feed-forwards (leading ``expert`` axis) behind a top-k router."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, x_GSM: Array, valid_GS: Array | None = None) -> Array:
        cfg = self.cfg
        experts, width, inner = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        dtype, pdtype = cfg.compute_dtype, cfg.params_dtype
        router = self.param(
            "router_kernel", _init(cfg, ("embed", "expert")), (width, experts), pdtype
        )
        # The router runs in fp32: its softmax and top-k decide discrete routes.
        logits_GSE = jnp.einsum(
            "gsm,me->gse", x_GSM.astype(jnp.float32), router.astype(jnp.float32)
        )
        capacity = expert_capacity(cfg, x_GSM.shape[1])
        if cfg.moe_routing == "expert_choice":
            dispatch_GSEC, combine_GSEC, stats = route_expert_choice(logits_GSE, capacity, valid_GS)
        else:
            dispatch_GSEC, combine_GSEC, stats = route(
                logits_GSE, cfg.experts_per_token, capacity, valid_GS
            )
        self.sow("intermediates", "moe", stats)

        w_in = self.param(
            "intermediate_kernel",
            _init(cfg, ("expert", "embed", "mlp")),
            (experts, width, inner),
            pdtype,
        )
        b_in = self.param("intermediate_bias", _zeros(("expert", "mlp")), (experts, inner), pdtype)
        w_out = self.param(
            "output_kernel", _init(cfg, ("expert", "mlp", "embed")), (experts, inner, width), pdtype
        )
        b_out = self.param("output_bias", _zeros(("expert", "embed")), (experts, width), pdtype)
        x_EGCM = jnp.einsum("gsec,gsm->egcm", dispatch_GSEC.astype(dtype), x_GSM.astype(dtype))
        x_EGCM = constrain(x_EGCM, ("act_expert", "act_batch", None, "act_embed"))
        h_EGCH = jnp.einsum("egcm,emh->egch", x_EGCM, w_in.astype(dtype))
        h_EGCH = activation(cfg.hidden_act)(h_EGCH + b_in.astype(dtype)[:, None, None, :])
        h_EGCH = constrain(h_EGCH, ("act_expert", "act_batch", None, "act_mlp"))
        y_EGCM = jnp.einsum("egch,ehm->egcm", h_EGCH, w_out.astype(dtype))
        y_EGCM = constrain(
            y_EGCM + b_out.astype(dtype)[:, None, None, :],
            ("act_expert", "act_batch", None, "act_embed"),
        )
        y_GSM = jnp.einsum("gsec,egcm->gsm", combine_GSEC.astype(dtype), y_EGCM)
        return constrain(y_GSM, ("act_batch", "act_len", "act_embed"))


class MoeBertLayer(BertLayer):
    """A BertLayer whose feed-forward is `MoeFeedForward` (same parameter path ``mlp``)."""

    @nn.nowrap
    def feed_forward(self, cfg: BertConfig, mask: Array):
        return functools.partial(MoeFeedForward(cfg, name="mlp"), valid_GS=token_mask(mask))


def token_mask(mask: Array) -> Array:
    """[B, T] True at real tokens, from a [B,1,1,T] or [B,1,T,T] attention mask (its diagonal)."""
    batch, length = mask.shape[0], mask.shape[-1]
    square = jnp.broadcast_to(mask[:, 0], (batch, length, length))
    return jnp.diagonal(square, axis1=1, axis2=2)


def layer_class(cfg: BertConfig, group: int) -> type:
    """The module type of distinct layer ``group``: MoE or dense (see BertConfig.is_moe_layer)."""
    return MoeBertLayer if cfg.is_moe_layer(group) else BertLayer


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


def apply_model(model: nn.Module, variables: dict, *args, **kwargs):
    """``model.apply`` that, for MoE configs, adds the collected stats as ``outputs["moe"]``
    (a model returning an array, like the fine-tuning heads, gives ``{"logits": ..., "moe": ...}``)."""
    if not model.cfg.num_experts:
        return model.apply(variables, *args, **kwargs)
    outputs, state = model.apply(variables, *args, mutable=["intermediates"], **kwargs)
    stats = collect_stats(state["intermediates"])
    if not isinstance(outputs, dict):
        outputs = {"logits": outputs}
    return {**outputs, "moe": {**stats, "aux_loss": aux_loss(model.cfg, stats)}}


def aux_loss(cfg: BertConfig, stats: dict) -> Array:
    """The weighted auxiliary loss that joins the total: z-loss and load-balancing terms."""
    return (
        cfg.router_z_loss_weight * stats["z_loss"]
        + cfg.load_balance_loss_weight * stats["balance_loss"]
    )


def loss_sums(outputs: dict, batch: dict, examples=None) -> dict:
    """Additive MoE sums: each per-token mean times this (micro)batch's share of the objective's
    ``norms["examples"]`` (by default its rows)."""
    if not isinstance(outputs, dict) or "moe" not in outputs:
        return {}
    if examples is None:
        examples = jnp.float32(batch["input_ids"].shape[0])
    return {f"moe_{name}": value * examples for name, value in outputs["moe"].items()}


def total_loss_term(sums: dict, norms: dict):
    """The MoE part of an objective's total loss: the weighted router losses per example (0 if dense)."""
    return sums["moe_aux_loss"] / norms["examples"] if "moe_aux_loss" in sums else 0.0


def metrics(sums: dict, norms: dict) -> dict:
    """moe_aux_loss, moe_z_loss, moe_balance_loss, moe_dropped_fraction, moe_load_<i>."""
    if "moe_aux_loss" not in sums:
        return {}
    out = {
        name: sums[name] / norms["examples"]
        for name in ("moe_aux_loss", "moe_z_loss", "moe_balance_loss", "moe_dropped_fraction")
    }
    load = sums["moe_expert_load"] / norms["examples"]
    out.update({f"moe_load_{i}": load[i] for i in range(load.shape[0])})
    return out
