"""The Objective: what a step computes from a batch, declared in one base class.

An objective builds the model, runs it on a batch, and turns the outputs into additive loss sums
plus global normalizers, so k microbatches summed give exactly the loss of the whole batch and
eval sums added over many batches give exact held-out averages. Everything the step and the
trainer may ask of an objective is a method here with a default: its data source, how a fresh
state is prepared (a pretrained encoder, a teacher), FGM, per-row predictions, the rows a sparse
last layer computes, the FLOPs of a step. Mixture-of-experts router losses join every objective's
loss here, in one place (`sums`, `loss`, `report`).
"""

from __future__ import annotations

import abc

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from bertjax.data import make_pipeline
from bertjax.data.data_config import PAIR_PLANS
from bertjax.data.source import DataSource
from bertjax.modeling import moe
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.heads import BertForPreTraining

Array = jax.Array


def default_loss_config() -> ml_collections.ConfigDict:
    """The ``config.loss`` defaults: BERT's MLM + NSP with equal weights."""
    c = ml_collections.ConfigDict()
    c.objective = "pretraining"  # what the step optimizes: a name in bertjax.objectives.OBJECTIVES
    c.mlm_weight = 1.0  # weight of the masked-LM loss in the total
    c.nsp_weight = 1.0  # weight of the next-sentence (NSP/SOP) loss in the total
    # NSP/SOP head and loss; None: follows config.data.sample_plan (sentence pairs: True)
    c.next_sentence = config_dict.placeholder(bool)
    # pretraining: the last layer runs only at the masked positions and [CLS], the rows the loss
    # reads (same loss and gradients, less work); False computes every row
    c.sparse_last_layer = True
    return c


def next_sentence(config: ml_collections.ConfigDict) -> bool:
    """Whether the run has an NSP/SOP head: ``config.loss.next_sentence`` when set, else whether
    ``config.data.sample_plan`` makes sentence pairs (True without a data config)."""
    derived = config.data.sample_plan in PAIR_PLANS if "data" in config else True
    chosen = config.loss.get("next_sentence")
    if chosen is None:
        return derived
    if "data" in config and bool(chosen) != derived:
        raise ValueError(
            f"config.loss.next_sentence={chosen} but config.data.sample_plan="
            f"{config.data.sample_plan!r} {'makes' if derived else 'makes no'} sentence pairs: "
            "leave config.loss.next_sentence unset to follow the data"
        )
    return bool(chosen)


def real_tokens(batch: dict) -> Array:
    """[B, T] float: 1 at real tokens (attention_mask, or segment_ids > 0 for packed rows)."""
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].astype(jnp.float32)
    if batch.get("segment_ids") is not None:
        return (batch["segment_ids"] > 0).astype(jnp.float32)
    return jnp.ones(batch["input_ids"].shape, jnp.float32)


class Objective(abc.ABC):
    """What a step computes: the model, its inputs, loss sums and metrics. Frozen and hashable
    (subclasses are frozen dataclasses: the step's static description)."""

    extra_config_keys: tuple = ()  # config.loss keys this objective adds to the defaults
    # True: the objective reads config.init_from itself (fine-tuning); otherwise a fresh state
    # starts from it through bertjax/objectives/warm_start.py (pretraining from a checkpoint)
    loads_init_from: bool = False
    fgm_epsilon: float = 0.0  # > 0: the step adds an FGM adversarial pass (fine-tuning)

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> Objective:
        """The objective a run config describes (``config.loss``, and ``config.data`` if any)."""

    def model(self, cfg: BertConfig) -> nn.Module:
        return BertForPreTraining(cfg, next_sentence=False)

    def init_batch(self, cfg: BertConfig) -> dict:
        """A tiny batch with every key `apply` reads (only shapes/dtypes matter)."""
        length = min(8, cfg.max_position_embeddings - cfg.position_offset)
        return {
            "input_ids": jnp.zeros((1, length), jnp.int32),
            "masked_positions": jnp.zeros((1, 1), jnp.int32),
        }

    def model_inputs(self, batch: dict) -> tuple:
        """The model's positional inputs from a batch."""
        return (
            batch["input_ids"],
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            batch.get("segment_ids"),
            batch["masked_positions"],
        )

    def init(self, model: nn.Module, rngs, batch: dict) -> dict:
        """The model's fresh variables (``params``; others such as a teacher's ``frozen``)."""
        return model.init(rngs, *self.model_inputs(batch), deterministic=True)

    def apply(self, model: nn.Module, variables: dict, batch: dict, rngs, deterministic: bool):
        """The model's outputs on a batch, always a dict (a bare array becomes ``logits``); MoE
        models add their router statistics as ``outputs["moe"]``."""
        args = self.model_inputs(batch)
        if not model.cfg.num_experts:
            outputs = model.apply(variables, *args, deterministic=deterministic, rngs=rngs)
        else:
            outputs, state = model.apply(
                variables, *args, deterministic=deterministic, rngs=rngs, mutable=["intermediates"]
            )
        if not isinstance(outputs, dict):
            outputs = {"logits": outputs}
        if model.cfg.num_experts:
            stats = moe.collect_stats(state["intermediates"])
            outputs["moe"] = {**stats, "aux_loss": moe.aux_loss(model.cfg, stats)}
        return outputs

    @abc.abstractmethod
    def loss_sums(self, outputs: dict, batch: dict) -> dict:
        """The objective's additive sums over the (micro)batch."""

    @abc.abstractmethod
    def normalizers(self, batch: dict) -> dict:
        """The objective's denominators over the whole global batch."""

    @abc.abstractmethod
    def total_loss(self, sums: dict, norms: dict) -> Array:
        """The objective's scalar loss, linear in ``sums``."""

    @abc.abstractmethod
    def metrics(self, sums: dict, norms: dict) -> dict:
        """Named scalars from (possibly accumulated) sums; "loss" is added by `report`."""

    # What the step calls: the objective's terms plus the MoE router losses. ----------------

    def sums(self, outputs: dict, batch: dict) -> dict:
        """`loss_sums` plus each MoE statistic times this (micro)batch's rows."""
        sums = self.loss_sums(outputs, batch)
        if "moe" in outputs:
            rows = jnp.float32(batch["input_ids"].shape[0])
            sums.update({f"moe_{name}": value * rows for name, value in outputs["moe"].items()})
        return sums

    def norms(self, batch: dict) -> dict:
        """`normalizers` plus the global batch's rows (the MoE statistics' denominator)."""
        return {**self.normalizers(batch), "rows": jnp.float32(batch["input_ids"].shape[0])}

    def loss(self, sums: dict, norms: dict) -> Array:
        """The scalar the step differentiates: `total_loss` plus the weighted router losses."""
        loss = self.total_loss(sums, norms)
        if "moe_aux_loss" in sums:
            loss = loss + sums["moe_aux_loss"] / norms["rows"]
        return loss

    def report(self, sums: dict, norms: dict) -> dict:
        """loss, the objective's metrics and the MoE ones (moe_aux_loss, moe_z_loss,
        moe_balance_loss, moe_dropped_fraction, moe_load_<i>)."""
        out = {"loss": self.loss(sums, norms), **self.metrics(sums, norms)}
        if "moe_aux_loss" in sums:
            names = ("moe_aux_loss", "moe_z_loss", "moe_balance_loss", "moe_dropped_fraction")
            out.update({name: sums[name] / norms["rows"] for name in names})
            load = sums["moe_expert_load"] / norms["rows"]
            out.update({f"moe_load_{i}": load[i] for i in range(load.shape[0])})
        return out

    # Hooks for the step and the trainer, with defaults. -------------------------------------

    def predictions(self, outputs: dict) -> Array | None:
        """Per-row predictions an eval step returns for task metrics (None: no task metrics)."""
        return None

    def last_layer_rows(self, cfg: BertConfig, masked_width: int) -> int | None:
        """Rows per sequence the last layer computes (for the FLOP count); None: every row."""
        return None

    def train_flops_per_sequence(
        self,
        cfg: BertConfig,
        seq_len: int,
        masked_per_sequence: float,
        masked_width: int | None,
        count,
    ) -> float:
        """Training FLOPs of one sequence (for MFU). ``count(cfg, seq_len, masked_per_sequence,
        last_layer_rows)`` counts one encoder with its MLM head (the trainer passes
        `bertjax.training.metrics.train_flops_per_sequence`); an objective that runs more than
        one encoder (ELECTRA) adds them up."""
        rows = None if masked_width is None else self.last_layer_rows(cfg, masked_width)
        return count(cfg, seq_len, masked_per_sequence, rows)

    def gradients(self, model: nn.Module, params, batch: dict, rng, norms: dict):
        """(grads, sums) when the objective computes its gradients itself (GradCache: the
        embedding objective), else None: the step differentiates `loss` over microbatches."""
        return None

    def make_data(self, config: ml_collections.ConfigDict, workdir: str) -> DataSource:
        """The run's data source (default: the pretraining pipeline)."""
        return make_pipeline(config, workdir)

    def prepare_state(self, state, data: DataSource):
        """A freshly initialised train state made ready (pretrained weights, a teacher)."""
        return state
