"""Knowledge distillation (DistilBERT, Sanh et al. 2019): a frozen teacher trains a shallower
student.

The reference is Hugging Face's distillation project (huggingface/transformers-research-projects
``distillation/``: ``distiller.py``, ``train.py``, ``scripts/extract_distilbert.py``). The loss is
alpha_ce * T^2 * KL(teacher || student) of the temperature-softened MLM distributions, averaged
over every real token (HF's default; ``restrict_ce_to_mask``: the masked positions only)
+ alpha_mlm * MLM cross-entropy at the masked positions + alpha_cos * (1 - cosine) between the
last hidden states, averaged over real tokens. T = 2, alpha_ce = 5, alpha_mlm = 2, alpha_cos = 1
are the DistilBERT command of HF's README (``train.py``'s own argparse defaults, 0.5 / 0 / 0 with
alpha_clm 0.5, are its GPT-2 setting). The student has the teacher's width and starts from teacher
layers spread from the first to the last (`default_student_layers`: 0, 2, 4, 7, 9, 11 for 12 -> 6,
as ``extract_distilbert.py``) plus its embeddings and MLM head. The teacher's params ride in
``TrainState.frozen``: sharded like any params, never in the optimizer, run inside the same jitted
step under stop_gradient.

The full-token KL needs both models' MLM logits at every real token: the one place where an MLM
head runs beyond the masked positions (the design's rule elsewhere). It is computed
``logits_chunk`` positions at a time under `jax.checkpoint`, so at most [B, chunk, V] logits of
each model are alive, forward and backward.

``config.loss.teacher`` names a bertjax workdir/checkpoints dir or a Hugging Face model dir. An
empty ``teacher`` means a *randomly initialised* teacher (``teacher_layers`` deep, the student's
width): it exists only so smoke tests can run the recipe offline, and logs a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax import paths
from bertjax.data import make_pipeline
from bertjax.interop.pretrained import PretrainedSource
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.heads import BertForPreTraining
from bertjax.objectives.base import derived, real_tokens
from bertjax.objectives.pretraining import MaskedLM, mlm_normalizers, mlm_sums

Array = jax.Array
TEACHER_KEY = "config.loss.teacher"


def add_distill_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Adds the ``config.loss`` keys of the "distill" objective at `Distillation`'s defaults
    (DistilBERT's)."""
    return Distillation.add_config(config)


def default_student_layers(teacher_layers: int, student_layers: int) -> tuple:
    """Teacher layers evenly spread from the first to the last, rounded half up:
    round(i * (L_t - 1) / (L_s - 1)). 12 -> 6 gives 0, 2, 4, 7, 9, 11, the layers HF's
    ``extract_distilbert.py`` copies into DistilBERT; 4 -> 2 gives 0, 3; one student layer: 0."""
    if student_layers == 1:
        return (0,)
    step = (teacher_layers - 1) / (student_layers - 1)
    return tuple(int(np.floor(i * step + 0.5)) for i in range(student_layers))


def kl_sum(student_logits: Array, teacher_logits: Array, weights: Array, temperature: float):
    """sum over positions of weights * KL(softmax(teacher / T) || softmax(student / T))."""
    teacher_logp = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    student_logp = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = jnp.sum(jnp.exp(teacher_logp) * (teacher_logp - student_logp), axis=-1)
    return jnp.sum(kl * weights)


def _mlm_head_logits(model, x_BCD):
    """The model's MLM head alone (transform + tied decoder) on hidden rows ``x_BCD``."""
    return model.mlm_head(x_BCD, model.bert)


def chunked_kl_sum(student_head, teacher_head, student_BTD, teacher_BTD, weights_BT, t, chunk):
    """`kl_sum` over every position, ``chunk`` positions at a time (0: all): each chunk's logits
    come from ``*_head(x_BCD)`` and are recomputed in the backward pass (`jax.checkpoint`)."""
    batch, length = student_BTD.shape[:2]
    chunk = min(chunk or length, length)
    chunks = -(-length // chunk)
    pad = chunks * chunk - length

    def split(x):  # [B, T, ...] -> [chunks, B, chunk, ...], padded with zero weights
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.swapaxes(x.reshape(batch, chunks, chunk, *x.shape[2:]), 0, 1)

    @jax.checkpoint
    def one(args):
        s_BCD, t_BCD, w_BC = args
        return kl_sum(student_head(s_BCD), teacher_head(t_BCD), w_BC, t)

    parts = jax.lax.map(one, (split(student_BTD), split(teacher_BTD), split(weights_BT)))
    return jnp.sum(parts)


def student_from_teacher(student: dict, teacher: dict, layers: tuple) -> dict:
    """The student's param tree filled from the teacher: every shared leaf (embeddings, MLM head,
    encoder norms) copied, and student ``layer_i`` = teacher ``layer_{layers[i]}``."""

    def fill(s, t, path):
        if not isinstance(s, Mapping):
            if jnp.shape(getattr(s, "value", s)) != jnp.shape(getattr(t, "value", t)):
                raise ValueError(f"student{path} has a different shape from the teacher's")
            return t
        out = {}
        for key, value in s.items():
            source = key
            if path == "/bert/encoder" and key.startswith("layer_"):
                source = f"layer_{layers[int(key[len('layer_') :])]}"
            if source not in t:
                raise ValueError(f"teacher params lack {path}/{source} needed by the student")
            out[key] = fill(value, t[source], f"{path}/{key}")
        return out

    return fill(student, teacher, "")


def _take_like(target, source: dict, where: str):
    """``source`` restricted to ``target``'s keys (drops e.g. the teacher's pooler and NSP head)."""
    if not isinstance(target, Mapping):
        return source
    missing = [k for k in target if k not in source]
    if missing:
        raise ValueError(f"config.loss.teacher={where!r}: its params lack {missing}")
    return {k: _take_like(v, source[k], where) for k, v in target.items()}


class Distillation(MaskedLM):
    """DistilBERT's triple loss for a student BertForPreTraining(cfg, next_sentence=False)."""

    objective_name = "distill"

    # bertjax workdir/checkpoints dir or HF model dir; "" = RANDOM teacher (smoke tests only)
    teacher: str = ""
    teacher_cfg: BertConfig | None = derived(None)  # None: random, the student's width
    teacher_layers: int = 0  # depth of the random teacher ("" teacher only); 0: twice the student's
    teacher_dtype: str = "float32"  # compute dtype of the teacher ("bfloat16" halves its cost)
    # teacher layer per student layer; () = spread first to last (default_student_layers)
    student_layers: tuple = ()
    temperature: float = 2.0  # softmax temperature T of the soft targets
    alpha_ce: float = 5.0  # weight of T^2 * KL(teacher || student), mean over its positions
    alpha_mlm: float = 2.0  # weight of the hard-label MLM cross-entropy
    alpha_cos: float = 1.0  # weight of 1 - cosine(student, teacher last hidden states)
    # KL at masked positions only (True) or at every real token (False: HF's default)
    restrict_ce_to_mask: bool = False
    logits_chunk: int = 128  # positions per chunk of the full-token KL logits (0: all at once)

    def __post_init__(self):
        object.__setattr__(self, "student_layers", tuple(int(i) for i in self.student_layers))

    def validate(self):
        if self.temperature <= 0:
            raise ValueError(f"config.loss.temperature={self.temperature!r}: must be > 0")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos", "logits_chunk"):
            if getattr(self, key) < 0:
                raise ValueError(f"config.loss.{key}={getattr(self, key)!r}: must be >= 0")

    @classmethod
    def from_config(cls, config):
        settings = cls.settings(config)
        teacher = settings.get("teacher", "")
        teacher_cfg = PretrainedSource(teacher, TEACHER_KEY).model_config() if teacher else None
        return cls(**settings, teacher_cfg=teacher_cfg)

    def teacher_config(self, student: BertConfig) -> BertConfig:
        """The teacher's BertConfig, checked against the student's."""
        if self.teacher_cfg is None:
            cfg = student.replace(
                num_hidden_layers=self.teacher_layers or 2 * student.num_hidden_layers
            )
        else:
            cfg = self.teacher_cfg
        cfg = cfg.replace(dtype=self.teacher_dtype)
        for key in (
            "hidden_size",
            "vocab_size",
            "embedding_size",
            "scan_layers",
            "num_hidden_groups",
        ):
            if getattr(cfg, key) != getattr(student, key):
                raise ValueError(
                    f"config.model.{key}={getattr(student, key)!r} but the teacher "
                    f"({self.teacher or 'random'}) has {getattr(cfg, key)!r}: a "
                    "distilled student must match the teacher's width and vocabulary"
                )
        if cfg.scan_layers or cfg.num_hidden_groups:
            raise ValueError(
                "config.model.scan_layers / num_hidden_groups: distillation supports "
                "only unscanned, unshared layers"
            )
        return cfg

    def layers(self, student: BertConfig) -> tuple:
        """The teacher layer each student layer starts from (validated)."""
        depth = self.teacher_config(student).num_hidden_layers
        layers = self.student_layers or default_student_layers(depth, student.num_hidden_layers)
        if len(layers) != student.num_hidden_layers or not all(0 <= i < depth for i in layers):
            raise ValueError(
                f"config.loss.student_layers={layers}: need one teacher layer in "
                f"[0, {depth}) per student layer ({student.num_hidden_layers})"
            )
        return layers

    def _teacher(self, student: BertConfig) -> BertForPreTraining:
        return BertForPreTraining(self.teacher_config(student), next_sentence=False)

    def init(self, model, rngs, batch):
        """Student params drawn from a fresh teacher, which is returned as ``frozen``."""
        inputs = self.model_inputs(batch)
        teacher_rngs = {"params": jax.random.fold_in(rngs["params"], 1)}
        teacher_params = self._teacher(model.cfg).init(teacher_rngs, **inputs, deterministic=True)
        student_params = model.init(rngs, **inputs, deterministic=True)["params"]
        layers = self.layers(model.cfg)
        return {
            "params": student_from_teacher(student_params, teacher_params["params"], layers),
            "frozen": teacher_params["params"],
        }

    def apply(self, model, variables, batch, rngs, deterministic):
        """Student outputs and the teacher's ``teacher_sequence_output``, plus ``distill_kl``
        (the KL summed over real tokens) or, with ``restrict_ce_to_mask``, the teacher's
        ``teacher_mlm_logits`` at the masked positions."""
        if variables.get("frozen") is None:
            raise ValueError(
                "the distill objective needs the teacher's params in TrainState.frozen"
            )
        frozen = jax.lax.stop_gradient(variables["frozen"])
        teacher = self._teacher(model.cfg)
        teacher_out = teacher.apply(
            {"params": frozen}, **self.model_inputs(batch), deterministic=True
        )
        params = {"params": variables["params"]}
        outputs = super().apply(model, params, batch, rngs, deterministic)
        teacher_BTD = jax.lax.stop_gradient(teacher_out["sequence_output"])
        outputs["teacher_sequence_output"] = teacher_BTD
        if self.restrict_ce_to_mask:
            outputs["teacher_mlm_logits"] = jax.lax.stop_gradient(teacher_out["mlm_logits"])
        else:
            outputs["distill_kl"] = chunked_kl_sum(
                lambda x: model.apply(params, x, method=_mlm_head_logits),
                lambda x: teacher.apply({"params": frozen}, x, method=_mlm_head_logits),
                outputs["sequence_output"],
                teacher_BTD,
                real_tokens(batch),
                self.temperature,
                self.logits_chunk,
            )
        return outputs

    def loss_sums(self, outputs, batch):
        if self.restrict_ce_to_mask:
            distill_kl = kl_sum(
                outputs["mlm_logits"],
                outputs["teacher_mlm_logits"],
                batch["masked_weights"].astype(jnp.float32),
                self.temperature,
            )
        else:
            distill_kl = outputs["distill_kl"]
        logits_BPV = outputs["mlm_logits"].astype(jnp.float32)
        student_BTD = outputs["sequence_output"].astype(jnp.float32)
        teacher_BTD = outputs["teacher_sequence_output"].astype(jnp.float32)
        cosine_BT = jnp.sum(student_BTD * teacher_BTD, -1) / jnp.maximum(
            jnp.linalg.norm(student_BTD, axis=-1) * jnp.linalg.norm(teacher_BTD, axis=-1), 1e-8
        )
        return {
            **mlm_sums(logits_BPV, batch),
            "distill_kl": distill_kl,
            "cosine_loss": jnp.sum((1.0 - cosine_BT) * real_tokens(batch)),
        }

    def normalizers(self, batch):
        tokens = jnp.sum(real_tokens(batch))
        return {**mlm_normalizers(batch), "tokens": jnp.where(tokens > 0, tokens, 1.0)}

    def _kl_positions(self, norms):
        """The KL's denominator: masked weight (restricted) or real tokens (HF's batchmean)."""
        return norms["mlm_weight"] if self.restrict_ce_to_mask else norms["tokens"]

    def total_loss(self, sums, norms):
        return (
            self.alpha_ce * self.temperature**2 * sums["distill_kl"] / self._kl_positions(norms)
            + self.alpha_mlm * sums["mlm_loss"] / norms["mlm_weight"]
            + self.alpha_cos * sums["cosine_loss"] / norms["tokens"]
        )

    def metrics(self, sums, norms):
        return {
            "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
            "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"],
            "distill_kl": sums["distill_kl"] / self._kl_positions(norms),
            "cosine_loss": sums["cosine_loss"] / norms["tokens"],
        }

    def make_data(self, config, workdir):
        """The pretraining pipeline on the teacher's tokenizer."""
        if not self.teacher:
            logging.warning(
                "config.loss.teacher is empty: distilling from a RANDOMLY initialised "
                "teacher (smoke tests only)"
            )
            return make_pipeline(config, workdir)
        source = PretrainedSource(self.teacher, TEACHER_KEY)
        config = config.copy_and_resolve_references()
        if source.is_hf and not config.data.hf_vocab:
            config.data.hf_vocab = source.tokenizer_file()
        elif not source.is_hf and not (config.data.tokenizer_model or config.data.hf_vocab):
            config.data.tokenizer_model = source.tokenizer_file(
                paths.cache_dir(config.data.cache_dir)
            )
        pipeline = make_pipeline(config, workdir)
        expected = source.tokenizer_fingerprint
        if expected is not None and pipeline.tokenizer.fingerprint() != expected:
            raise ValueError(
                f"config.data.tokenizer_model={config.data.tokenizer_model!r} is not the "
                f"tokenizer of {TEACHER_KEY}={self.teacher!r}; leave it empty to use the teacher's"
            )
        return pipeline

    def prepare_state(self, state, data):
        """``state`` with the teacher's params in ``frozen`` and the student drawn from them."""
        state = super().prepare_state(state, data)
        if not self.teacher:
            return state  # the random teacher and its student were made by init
        frozen = self._load_teacher(state.frozen)
        layers = self.layers(state.spec.model_cfg)
        shardings = jax.tree.map(lambda x: x.sharding, state.params)
        params = jax.jit(lambda p, t: student_from_teacher(p, t, layers), out_shardings=shardings)(
            state.params, frozen
        )
        return state.replace(params=params, frozen=frozen)

    def resume_state(self, state, data, fresh):
        """The teacher is never checkpointed: reloaded from ``config.loss.teacher`` (or, for the
        random teacher, drawn again by init from the run's seed)."""
        if not self.teacher:
            return state.replace(frozen=fresh().frozen)
        return state.replace(frozen=self._load_teacher(state.frozen))

    def _load_teacher(self, targets):
        """The teacher's params from its source, placed as ``targets`` (arrays or shapes with
        shardings) are."""
        source = PretrainedSource(self.teacher, TEACHER_KEY)
        loaded = _take_like(targets, source.params(), self.teacher)

        def put(path, target, value):
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"{TEACHER_KEY}={self.teacher!r}: {jax.tree_util.keystr(path)} has shape "
                    f"{value.shape}, the teacher model expects {target.shape}"
                )
            return jax.device_put(np.asarray(value, target.dtype), target.sharding)

        return jax.tree_util.tree_map_with_path(put, targets, loaded)
