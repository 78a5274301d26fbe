"""Knowledge distillation (DistilBERT, Sanh et al. 2019): a frozen teacher trains a shallower student.

The loss is alpha_ce * T^2 * KL(teacher || student) of temperature-softened MLM distributions at
masked positions + alpha_mlm * MLM cross-entropy + alpha_cos * (1 - cosine) between the last hidden
states at real tokens. The student has the teacher's width and starts from chosen teacher layers
plus its embeddings and MLM head. The teacher's params ride in ``TrainState.frozen``: sharded like
any params, never in the optimizer, run inside the same jitted step under stop_gradient.

``config.loss.teacher`` names a bertjax workdir/checkpoints dir or a Hugging Face model dir. An
empty ``teacher`` means a *randomly initialised* teacher (``teacher_layers`` deep, the student's
width): it exists only so smoke tests can run the recipe offline, and logs a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from bertjax import checkpoint as checkpoint_lib
from bertjax import moe
from bertjax.config import BertConfig
from bertjax.heads import BertForPreTraining
from bertjax.objectives import Objective, cross_entropy, normalizers

Array = jax.Array


def add_distill_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Adds the ``config.loss`` keys of the "distill" objective (DistilBERT's defaults)."""
    loss = config.loss
    with loss.unlocked():
        loss.objective = "distill"
        loss.next_sentence = False  # the student has no NSP head
        loss.teacher = ""  # bertjax workdir/checkpoints dir or HF model dir; "" = RANDOM teacher (smoke tests only)
        loss.teacher_layers = (
            0  # depth of the random teacher ("" teacher only); 0 = twice the student's
        )
        loss.teacher_dtype = (
            "float32"  # compute dtype of the teacher forward ("bfloat16" halves its cost)
        )
        loss.student_layers = ()  # teacher layer per student layer; () = evenly spaced (every other)
        loss.temperature = 2.0  # softmax temperature T of the soft targets
        loss.alpha_ce = 5.0  # weight of T^2 * KL(teacher || student) on masked positions
        loss.alpha_mlm = 2.0  # weight of the hard-label MLM cross-entropy
        loss.alpha_cos = 1.0  # weight of 1 - cosine(student, teacher last hidden states)
    return config


def _checkpoints_dir(path: str) -> str:
    sub = os.path.join(path, "checkpoints")
    return sub if os.path.isdir(sub) else path


def _is_hf(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def _manager(path: str):
    return ocp.CheckpointManager(
        _checkpoints_dir(path),
        item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(read_only=True),
    )


@functools.lru_cache(maxsize=4)
def read_teacher_meta(path: str) -> dict:
    """The meta (model config, tokenizer) of the latest bertjax checkpoint under ``path``."""
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"config.loss.teacher={path!r} is not a directory (a bertjax workdir, "
            "its checkpoints/ dir, or a Hugging Face model dir)"
        )
    manager = _manager(path)
    if manager.latest_step() is None:
        raise FileNotFoundError(
            f"config.loss.teacher={path!r}: no complete bertjax checkpoint in "
            f"{_checkpoints_dir(path)}"
        )
    meta = manager.restore(
        manager.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    )["meta"]
    if "model_config" not in meta or "tokenizer_bytes" not in meta:
        raise ValueError(
            f"config.loss.teacher={path!r}: its checkpoint meta has no model config or "
            "tokenizer; is it a bertjax pretraining checkpoint?"
        )
    return meta


def teacher_model_config(path: str) -> BertConfig:
    """The teacher's BertConfig, read from its checkpoint meta or HF config.json (no weights)."""
    if _is_hf(path):
        from bertjax import convert

        with open(os.path.join(path, "config.json")) as f:
            return convert._config_from_hf(json.load(f), path)
    return BertConfig.from_dict(read_teacher_meta(path)["model_config"])


def load_teacher_params(path: str) -> dict:
    """The teacher's full parameter tree as host arrays."""
    if _is_hf(path):
        from bertjax import convert

        return convert.from_hf(path)[1]
    manager = _manager(path)
    restored = manager.restore(
        manager.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore())
    )
    return jax.tree.map(np.asarray, restored["state"]["params"])


def default_student_layers(teacher_layers: int, student_layers: int) -> tuple:
    """Evenly spaced teacher layers, starting at 0 (12 -> 6: 0, 2, 4, 6, 8, 10)."""
    return tuple(i * teacher_layers // student_layers for i in range(student_layers))


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


@dataclasses.dataclass(frozen=True)
class DistillObjective(Objective):
    """DistilBERT's triple loss for a student BertForPreTraining(cfg, next_sentence=False)."""

    extra_config_keys = (
        "teacher",
        "teacher_layers",
        "teacher_dtype",
        "student_layers",
        "temperature",
        "alpha_ce",
        "alpha_mlm",
        "alpha_cos",
    )
    teacher: str = ""
    teacher_cfg: BertConfig | None = None  # None: a random teacher of the student's width
    teacher_layers: int = 0
    teacher_dtype: str = "float32"
    student_layers: tuple = ()
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0

    @classmethod
    def from_config(cls, loss_config):
        teacher = str(loss_config.teacher)
        for key in ("temperature",):
            if float(loss_config[key]) <= 0:
                raise ValueError(f"config.loss.{key}={loss_config[key]!r}: must be > 0")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            if float(loss_config[key]) < 0:
                raise ValueError(f"config.loss.{key}={loss_config[key]!r}: must be >= 0")
        return cls(
            teacher,
            teacher_model_config(teacher) if teacher else None,
            int(loss_config.teacher_layers),
            str(loss_config.teacher_dtype),
            tuple(int(i) for i in loss_config.student_layers),
            float(loss_config.temperature),
            float(loss_config.alpha_ce),
            float(loss_config.alpha_mlm),
            float(loss_config.alpha_cos),
        )

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

    def apply(self, model, variables, batch, rngs, deterministic, init=False):
        """Student outputs plus the teacher's (``teacher_*``); ``init``: student params drawn from a
        fresh teacher, which is returned as the ``frozen`` collection."""
        teacher = BertForPreTraining(self.teacher_config(model.cfg), next_sentence=False)
        args = (
            batch["input_ids"],
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            batch.get("segment_ids"),
            batch["masked_positions"],
        )
        if init:
            teacher_params = teacher.init(
                {"params": jax.random.fold_in(rngs["params"], 1)}, *args, deterministic=True
            )["params"]
            student_params = model.init(rngs, *args, deterministic=deterministic)["params"]
            return {
                "params": student_from_teacher(
                    student_params, teacher_params, self.layers(model.cfg)
                ),
                "frozen": teacher_params,
            }
        if variables.get("frozen") is None:
            raise ValueError(
                "the distill objective needs the teacher's params in TrainState.frozen"
            )
        frozen = jax.lax.stop_gradient(variables["frozen"])
        teacher_out = teacher.apply({"params": frozen}, *args, deterministic=True)
        outputs = super().apply(model, {"params": variables["params"]}, batch, rngs, deterministic)
        return {
            **outputs,
            "teacher_mlm_logits": jax.lax.stop_gradient(teacher_out["mlm_logits"]),
            "teacher_sequence_output": jax.lax.stop_gradient(teacher_out["sequence_output"]),
        }

    def loss_sums(self, outputs, batch):
        weights_BP = batch["masked_weights"].astype(jnp.float32)
        logits_BPV = outputs["mlm_logits"].astype(jnp.float32)
        teacher_BPV = outputs["teacher_mlm_logits"].astype(jnp.float32)
        nll_BP, correct_BP = cross_entropy(logits_BPV, batch["masked_ids"])
        t = self.temperature
        teacher_logp = jax.nn.log_softmax(teacher_BPV / t, axis=-1)
        student_logp = jax.nn.log_softmax(logits_BPV / t, axis=-1)
        kl_BP = jnp.sum(jnp.exp(teacher_logp) * (teacher_logp - student_logp), axis=-1)
        student_BTH = outputs["sequence_output"].astype(jnp.float32)
        teacher_BTH = outputs["teacher_sequence_output"].astype(jnp.float32)
        cosine_BT = jnp.sum(student_BTH * teacher_BTH, -1) / jnp.maximum(
            jnp.linalg.norm(student_BTH, axis=-1) * jnp.linalg.norm(teacher_BTH, axis=-1), 1e-8
        )
        real_BT = _real_tokens(batch)
        sums = {
            "mlm_loss": jnp.sum(nll_BP * weights_BP),
            "mlm_correct": jnp.sum(correct_BP * weights_BP),
            "distill_kl": jnp.sum(kl_BP * weights_BP),
            "cosine_loss": jnp.sum((1.0 - cosine_BT) * real_BT),
        }
        sums.update(moe.loss_sums(outputs, batch))
        return sums

    def normalizers(self, batch):
        tokens = jnp.sum(_real_tokens(batch))
        return {**normalizers(batch), "tokens": jnp.where(tokens > 0, tokens, 1.0)}

    def total_loss(self, sums, norms):
        loss = (
            self.alpha_ce * self.temperature**2 * sums["distill_kl"] / norms["mlm_weight"]
            + self.alpha_mlm * sums["mlm_loss"] / norms["mlm_weight"]
            + self.alpha_cos * sums["cosine_loss"] / norms["tokens"]
        )
        return loss + moe.total_loss_term(sums, norms)

    def metrics(self, sums, norms):
        return {
            "loss": self.total_loss(sums, norms),
            "mlm_loss": sums["mlm_loss"] / norms["mlm_weight"],
            "mlm_accuracy": sums["mlm_correct"] / norms["mlm_weight"],
            "distill_kl": sums["distill_kl"] / norms["mlm_weight"],
            "cosine_loss": sums["cosine_loss"] / norms["tokens"],
            **moe.metrics(sums, norms),
        }

    def make_data(self, config, workdir):
        return DistillData(config, workdir, self)


def _real_tokens(batch: dict) -> Array:
    """[B, T] float: 1 at real tokens (attention_mask, or segment_ids > 0 for packed rows)."""
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].astype(jnp.float32)
    if batch.get("segment_ids") is not None:
        return (batch["segment_ids"] > 0).astype(jnp.float32)
    return jnp.ones(batch["input_ids"].shape, jnp.float32)


class DistillData:
    """The pretraining pipeline on the teacher's tokenizer, plus `teacher_state` (fresh runs)."""

    def __init__(self, config, workdir: str, objective: DistillObjective):
        from bertjax.data import make_pipeline

        self.objective, source = objective, objective.teacher
        if not source:
            logging.warning(
                "config.loss.teacher is empty: distilling from a RANDOMLY initialised "
                "teacher (smoke tests only)"
            )
            self._pipeline = make_pipeline(config, workdir)
            return
        config = config.copy_and_resolve_references()
        if _is_hf(source):
            if not config.data.hf_vocab:
                name = next(
                    (
                        n
                        for n in ("tokenizer.json", "vocab.txt")
                        if os.path.isfile(os.path.join(source, n))
                    ),
                    None,
                )
                if name is None:
                    raise FileNotFoundError(
                        f"config.loss.teacher={source!r} has no tokenizer.json or vocab.txt"
                    )
                config.data.hf_vocab = os.path.join(source, name)
            self._pipeline = make_pipeline(config, workdir)
            return
        meta = read_teacher_meta(source)
        if not config.data.tokenizer_model and not config.data.hf_vocab:
            config.data.tokenizer_model = checkpoint_lib.write_tokenizer(
                meta, os.path.join(workdir, "teacher")
            )
        self._pipeline = make_pipeline(config, workdir)
        if self._pipeline.tokenizer.fingerprint() != meta["tokenizer_fingerprint"]:
            raise ValueError(
                f"config.data.tokenizer_model={config.data.tokenizer_model!r} is not the "
                f"tokenizer of config.loss.teacher={source!r}; leave it empty to use the "
                "teacher's"
            )

    def __getattr__(self, name):
        return getattr(self.__dict__["_pipeline"], name)

    def teacher_state(self, state):
        """``state`` with the teacher's params in ``frozen`` and the student drawn from them."""
        if not self.objective.teacher:
            return state  # the random teacher and its student were made by init
        loaded = _take_like(
            jax.tree.map(lambda x: x, state.frozen),
            load_teacher_params(self.objective.teacher),
            self.objective.teacher,
        )

        def put(path, target, value):
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"config.loss.teacher={self.objective.teacher!r}: "
                    f"{jax.tree_util.keystr(path)} has shape {value.shape}, the teacher "
                    f"model expects {target.shape}"
                )
            return jax.device_put(np.asarray(value, target.dtype), target.sharding)

        frozen = jax.tree_util.tree_map_with_path(put, state.frozen, loaded)
        layers = self.objective.layers(state.spec.model_cfg)
        shardings = jax.tree.map(lambda x: x.sharding, state.params)
        params = jax.jit(lambda p, t: student_from_teacher(p, t, layers), out_shardings=shardings)(
            state.params, frozen
        )
        return state.replace(params=params, frozen=frozen)
