"""The Objective: what a step computes from a batch, declared in one base class.

An objective builds the model, runs it on a batch, and turns the outputs into additive loss sums
plus global normalizers, so k microbatches summed give exactly the loss of the whole batch and
eval sums added over many batches give exact held-out averages. Everything the step and the
trainer may ask of an objective is here with a default: the data corruption it trains on
(``corruptions``), its settings (its dataclass fields, each a ``config.loss`` key with its
default), its model inputs by name (``input_names``), its data source, how a fresh or resumed
state is prepared (the MLM bias, a pretrained encoder, a teacher), how its gradients are taken
(FGM), per-row predictions, the rows a sparse last layer computes, the FLOPs of a step, and the
metrics a run prints (``headline_metrics``). Mixture-of-experts router losses join every
objective's loss here, in one place (`sums`, `loss`, `report`).

Subclasses are made frozen, keyword-only dataclasses when they are created (`__init_subclass__`):
hashable, the step's static description.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
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


def example_rows(cfg: BertConfig, rows: int, length: int, seed: int) -> dict:
    """Random ``input_ids``, ``token_type_ids`` and ``attention_mask`` (every third row ends in
    padding), the part of an `Objective.example_batch` every encoder reads."""
    rs = np.random.RandomState(seed)
    attention_mask = np.ones((rows, length), np.int32)
    attention_mask[::3, length - length // 4 :] = 0
    token_types = np.zeros((rows, length), np.int32)
    token_types[:, length // 2 :] = 1
    low = min(5, cfg.vocab_size - 1)
    return dict(
        input_ids=rs.randint(low, cfg.vocab_size, (rows, length)).astype(np.int32),
        token_type_ids=token_types,
        attention_mask=attention_mask,
    )


def real_tokens(batch: dict) -> Array:
    """[B, T] float: 1 at real tokens (attention_mask, or segment_ids > 0 for packed rows)."""
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].astype(jnp.float32)
    if batch.get("segment_ids") is not None:
        return (batch["segment_ids"] > 0).astype(jnp.float32)
    return jnp.ones(batch["input_ids"].shape, jnp.float32)


RUN_KEY = {"run_key": True}  # field metadata: a setting read from the run config's top level
DERIVED = {"derived": True}  # field metadata: filled by from_config, not a config key


def run_setting(default):
    """A setting read from ``config.<name>`` (the run's top level), not ``config.loss``."""
    return dataclasses.field(default=default, metadata=RUN_KEY)


def derived(default):
    """A field `from_config` computes (e.g. from the data config), never a config key."""
    return dataclasses.field(default=default, metadata=DERIVED)


def _config_value(field: dataclasses.Field):
    """A setting's config default: the field's default, or for a None default a placeholder of
    the field's declared type (``bool | None`` -> bool), so the key stays settable from the
    command line (ml_collections cannot type a bare None)."""
    if field.default is not None:
        return field.default
    annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    for kind in (bool, int, float, str):
        if kind.__name__ in annotation.replace(" ", "").split("|"):
            return config_dict.placeholder(kind)
    raise TypeError(
        f"{field.name}: a None default needs a bool/int/float/str type, not {annotation}"
    )


@dataclasses.dataclass(frozen=True)
class TokenNLL:
    """Declares metric ``metric`` an unsmoothed mean negative log-likelihood per token, in nats:
    sum(w * -log softmax(outputs[logits])[batch[targets]]) / sum(w), w = batch[weights]. The
    held-out ``perplexity`` is derived from it (`Objective.held_out_metrics`), and
    tests/objective_contract_test.py recomputes it in float64 from the model's outputs, so a
    smoothed or reweighted loss reported under that name fails a test."""

    metric: str  # the metric's name in the objective's report
    perplexity: str = "perplexity"  # the held-out metric derived from it: exp(metric)
    logits: str = "mlm_logits"  # outputs key: [B, P, V] logits
    targets: str = "masked_ids"  # batch key: [B, P] target ids
    weights: str = "masked_weights"  # batch key: [B, P] weights (0: no prediction)


class Objective(abc.ABC):
    """What a step computes: the model, its inputs, loss sums and metrics. Every subclass is a
    frozen, keyword-only dataclass (made so at class creation); its fields are its settings,
    each read from the ``config.loss`` key of its name (`from_config`) with the field's default.
    """

    # Its config.loss.objective value, the key of bertjax.objectives.OBJECTIVES (each
    # registered class sets it; not a field: the class's name, not a setting).
    objective_name: str = ""
    # The config.data.masking values this objective trains on; None: it reads no pretraining
    # corruption (fine-tuning). Checked once, where objectives are made (registry.make_objective).
    corruptions: tuple | None = None
    # The batch keys the model takes, passed by name (absent keys as None).
    input_names: tuple = (
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "segment_ids",
        "masked_positions",
    )
    # True: the loss sums add up over rows, so microbatches accumulate exactly. An objective
    # whose rows interact (in-batch negatives of a contrastive loss) sets False, and the step
    # refuses config.optim.grad_accum_steps > 1 for it.
    microbatch_additive: bool = True
    # The held-out metrics a run prints at its end (train.py), after step and train/loss.
    headline_metrics: tuple = ()
    # True: the objective reads config.init_from itself (fine-tuning); otherwise a fresh state
    # starts from it through bertjax/objectives/warm_start.py (pretraining from a checkpoint)
    loads_init_from: bool = False
    extra_config_keys: tuple = ()  # its config.loss keys beyond default_loss_config (computed)
    # The metric that is an unsmoothed per-token NLL (perplexity derives from it); None: none.
    # Report a smoothed or reweighted loss under another name (the contract test checks it).
    token_nll: TokenNLL | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        shared = set(default_loss_config().keys())
        cls.extra_config_keys = tuple(name for name in cls.setting_names() if name not in shared)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            if type(self).__init__ is __init__:  # the object's own class: validate once
                for klass in reversed(type(self).__mro__):
                    if "validate" in vars(klass):
                        vars(klass)["validate"](self)

        cls.__init__ = __init__

    def validate(self) -> None:
        """Checks of the settings this class declares, raising ValueError naming the
        ``config.loss`` key. Every class's own `validate` runs when an objective is made, base
        classes first, after ``__post_init__`` (which may normalize values), whether or not a
        subclass calls ``super()``: a subclass cannot skip its parents' checks."""

    @classmethod
    def setting_names(cls) -> tuple:
        """The ``config.loss`` keys this objective reads (its fields, less run keys and derived)."""
        return tuple(
            f.name
            for f in dataclasses.fields(cls)
            if not f.metadata.get("run_key") and not f.metadata.get("derived")
        )

    @classmethod
    def settings(cls, config: ml_collections.ConfigDict) -> dict:
        """The keyword arguments of the objective ``config`` describes: each setting from
        ``config.loss`` (or the run's top level), the field's default where unset."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.metadata.get("derived"):
                continue
            source = config if f.metadata.get("run_key") else config.loss
            value = source.get(f.name) if f.name in source else None
            if value is None:
                continue
            default = f.default
            if isinstance(default, bool | int | float | str | tuple):
                value = type(default)(value)
            values[f.name] = value
        return values

    @classmethod
    def add_config(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """Turns a run config into one for this objective (before it is locked): its name and
        its settings at their defaults (the one place those are declared)."""
        with config.loss.unlocked():
            config.loss.objective = cls.objective_name
            for f in dataclasses.fields(cls):
                if f.name in cls.extra_config_keys:
                    config.loss[f.name] = _config_value(f)
        return config

    @classmethod
    def add_settings(cls, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """Adds the settings of this objective that ``config.loss`` lacks, at their defaults
        (values already there are kept): what makes ``--config.loss.objective=NAME
        --config.loss.<its setting>=v`` work from any recipe (`registry.with_objective`)."""
        with config.loss.unlocked():
            for f in dataclasses.fields(cls):
                if f.name in cls.extra_config_keys and f.name not in config.loss:
                    config.loss[f.name] = _config_value(f)
        return config

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> Objective:
        """The objective a run config describes (``config.loss``, and ``config.data`` if any)."""
        return cls(**cls.settings(config))

    def model(self, cfg: BertConfig) -> nn.Module:
        return BertForPreTraining(cfg, next_sentence=False)

    def init_batch(self, cfg: BertConfig) -> dict:
        """A tiny batch with every key `apply` reads (only shapes/dtypes matter)."""
        length = min(8, cfg.max_position_embeddings - cfg.position_offset)
        return {
            "input_ids": jnp.zeros((1, length), jnp.int32),
            "masked_positions": jnp.zeros((1, 1), jnp.int32),
        }

    def model_inputs(self, batch: dict) -> dict:
        """The model's keyword inputs from a batch (``input_names``; absent keys as None)."""
        return {name: batch.get(name) for name in self.input_names}

    def init(self, model: nn.Module, rngs, batch: dict) -> dict:
        """The model's fresh variables (``params``; others such as a teacher's ``frozen``)."""
        return model.init(rngs, **self.model_inputs(batch), deterministic=True)

    def apply(self, model: nn.Module, variables: dict, batch: dict, rngs, deterministic: bool):
        """The model's outputs on a batch, always a dict (a bare array becomes ``logits``); MoE
        models add their router statistics as ``outputs["moe"]``."""
        inputs = self.model_inputs(batch)
        if not model.cfg.num_experts:
            outputs = model.apply(variables, **inputs, deterministic=deterministic, rngs=rngs)
        else:
            outputs, state = model.apply(
                variables,
                **inputs,
                deterministic=deterministic,
                rngs=rngs,
                mutable=["intermediates"],
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

    def batch_flops(self, cfg: BertConfig, host_batch: dict, batch_size: int, count) -> float:
        """Training FLOPs of a global batch of ``batch_size`` rows, of which ``host_batch`` is
        this host's share (the masked predictions a row makes, and the slots a sparse last
        layer computes, read from the batch)."""
        processes = jax.process_count()
        masked = float(np.sum(host_batch.get("masked_weights", 0) > 0)) * processes
        width = None  # masked slots per row (a sparse last layer computes those rows)
        if "masked_positions" in host_batch:
            width = host_batch["masked_positions"].shape[1]
        length = host_batch["input_ids"].shape[1]
        return batch_size * self.train_flops_per_sequence(
            cfg, length, masked / batch_size, width, count
        )

    def gradients(self, grad_fn: Callable, model: nn.Module) -> Callable:
        """How the step takes gradients: ``grad_fn(params, batch, rng) -> (grads, sums)`` as
        is, or wrapped (fine-tuning's FGM adversarial pass), or replaced by one that runs
        ``model`` itself (the embedding objective's GradCache, for objectives that are not
        `microbatch_additive`, so ``batch`` is the whole global batch)."""
        return grad_fn

    def make_data(self, config: ml_collections.ConfigDict, workdir: str) -> DataSource:
        """The run's data source (default: the pretraining pipeline)."""
        return make_pipeline(config, workdir)

    def prepare_state(self, state, data: DataSource):
        """A freshly initialised train state made ready (the MLM bias, pretrained weights, a
        teacher)."""
        return state

    def resume_state(self, state, data: DataSource, fresh: Callable):
        """A state restored from a checkpoint made whole: what checkpoints leave out (a
        teacher, ``state.frozen``) put back; ``fresh()`` is a freshly initialised state."""
        return state

    # Metrics that depend on the step's rng beyond dropout (ELECTRA's sampled replacements): an
    # eval step cannot reproduce them, so the objective contract test compares the others.
    rng_dependent_metrics: tuple = ()

    def example_batch(self, cfg: BertConfig, rows: int, length: int, seed: int) -> dict:
        """A random batch (numpy) of every key this objective reads, with padding: what the
        objective contract test (tests/objective_contract_test.py) trains on."""
        raise NotImplementedError(
            f"{type(self).__name__}.example_batch: define it (every batch key the objective "
            "reads) so tests/objective_contract_test.py can check the objective"
        )

    def held_out_counts(self, host_batch: dict) -> collections.Counter:
        """Host-side counts over an eval batch that `held_out_metrics` reads (added up)."""
        return collections.Counter()

    def held_out_metrics(self, metrics: dict, counts: collections.Counter) -> dict:
        """Held-out metrics beyond the report's: the perplexity of the `token_nll` metric (its
        exp, capped at e^50); subclasses add more (a majority baseline)."""
        metrics = dict(metrics)
        nll = self.token_nll
        if nll is not None and nll.metric in metrics:
            metrics[nll.perplexity] = math.exp(min(metrics[nll.metric], 50.0))
        return metrics
