"""The run config (``config``): every key a run reads, with defaults; the model config it
implies; the checks across sub-configs; and loading a recipe file (configs/*.py)."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import typing

import ml_collections
from absl import flags
from ml_collections import config_dict
from ml_collections.config_flags import config_flags  # its parser and flag classes

from bertjax import cli, paths
from bertjax.data import default_data_config
from bertjax.data.plans.batch_plan import default_batch_warmup_config
from bertjax.modeling import attention_kernels
from bertjax.modeling.bert_config import BertConfig
from bertjax.objectives.registry import OBJECTIVES, with_objective
from bertjax.training.phases import plan_phases
from bertjax.training.step import default_step_config, validate_step_config
from bertjax.training.trackers import add_tracking_config, validate_tracking_config

# Model fields the tokenizer decides; a run config never sets them.
_TOKENIZER_FIELDS = (
    "vocab_size",
    "pad_token_id",
    "unk_token_id",
    "cls_token_id",
    "sep_token_id",
    "mask_token_id",
)
_FIELD_TYPES = typing.get_type_hints(BertConfig)


def _optional_type(name: str) -> type:
    """The type inside a BertConfig field's ``Optional[...]`` (int, float or str)."""
    return next(t for t in typing.get_args(_FIELD_TYPES[name]) if t is not type(None))


def model_config_dict(preset: str, **overrides) -> ml_collections.ConfigDict:
    """``config.model``: every BertConfig field of a preset except the tokenizer's ids/size; a
    field that is None gets a typed placeholder, so it can be set on the command line."""
    fields = BertConfig.preset(preset, **overrides).to_dict()
    return ml_collections.ConfigDict(
        {
            k: config_dict.placeholder(_optional_type(k)) if v is None else v
            for k, v in fields.items()
            if k not in _TOKENIZER_FIELDS
        }
    )


def default_run_config() -> ml_collections.ConfigDict:
    """Every key a pretraining run reads, with defaults; configs/*.py start from this."""
    config = default_step_config()  # seed, batch_size, skip_nonfinite, optim, mesh, loss
    config.num_train_steps = 1000  # optimizer steps; the LR schedule spans them
    config.optim.total_steps = config.get_ref("num_train_steps")
    config.model = model_config_dict("tiny")  # BertConfig fields (vocab and special ids: tokenizer)
    config.data = default_data_config()
    config.log_every = 50  # steps between train-metric fetches (the only host syncs)
    config.eval_every = 500  # steps between held-out evals (0: no eval)
    config.eval_batches = 8  # held-out batches per eval (fixed, same every eval)
    config.checkpoint_every = 500  # steps between checkpoints (0: only at the end)
    config.keep_checkpoints = 3  # complete checkpoints kept
    config.async_checkpoints = True  # save in the background while training continues
    # seconds a storage request failing with transient errors (timeouts, 429, 5xx) is tried again
    # before the run saves and exits 75 to be restarted (bertjax/retry.py); an outage shorter
    # than this is ridden out
    config.storage_retry_seconds = 600.0
    # JAX's persistent compilation cache (train.py; bertjax/training/compile_cache.py): "" =
    # $BERTJAX_COMPILE_CACHE where set, else WORKDIR/compile_cache; a directory or URL, or
    # "off"; whoever can write it can run code
    config.compile_cache = ""
    # new models' MLM decoder bias: "unigram" (log token frequencies) | "zeros" (BERT)
    config.mlm_bias_init = "unigram"
    config.peak_flops_per_device = 0.0  # for MFU; 0 = by device kind, CPU measured at start
    config.progress_bar = True  # tqdm bar with loss, tokens/s, MFU and ETA (process 0)
    # XLA at -O0 for the run's steps: compiles ~2x faster, runs ~2.5x slower (smoke runs, tests)
    config.fast_compile = False
    # a model to start from: "" (fresh init) | a bertjax workdir/checkpoint | an HF directory
    # (pretraining: its weights, and its tokenizer unless config.data names one; fine-tuning:
    # its encoder)
    config.init_from = ""
    config.init_tiling = False  # pretraining: centre-tile init_from into a larger model
    # > 0: the run lasts until its training FLOPs (the trainer's count) reach this; it sets
    # num_train_steps and the schedule's total_steps (cramming's budget, deterministic)
    config.budget_flops = 0.0
    # batch-size warmup by tokens (bertjax/data/plans/batch_plan.py); off by default
    config.batch_warmup = default_batch_warmup_config()
    # phases run in this order (names in config.phases, each `bertjax.trainer.phase(...)`);
    # () = one phase of num_train_steps (bertjax/training/phases.py)
    config.phase_order = ()
    config.phases = ml_collections.ConfigDict()  # name -> `bertjax.trainer.phase(...)` entry
    add_tracking_config(config)  # trackers (TensorBoard, metrics.jsonl, W&B), wandb, profile
    # "auto": a phase whose step does not fit a device's memory with 10% headroom gets
    # microbatches, remat and FSDP chosen by compiling candidates, the global batch kept
    # (bertjax/aot/fit.py; printed, and saved with each checkpoint) | "off": as configured
    config.fit = "auto"
    config.fit_memory_gib = 0.0  # memory a device the fit plans for (0: the device's own)
    return config


def model_config(config: ml_collections.ConfigDict, tokenizer) -> BertConfig:
    """The BertConfig of a run: ``config.model`` plus the tokenizer's vocabulary and ids."""
    fields = dict(config.model.to_dict())
    fields.update(
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_id,
        unk_token_id=tokenizer.unk_id,
        cls_token_id=tokenizer.cls_id,
        sep_token_id=tokenizer.sep_id,
        mask_token_id=tokenizer.mask_id,
    )
    return _model_config(fields)


def _model_config(fields: dict) -> BertConfig:
    """BertConfig(**fields), its messages naming the run config's keys (config.model.X)."""
    try:
        return BertConfig.from_dict(fields)
    except ValueError as error:
        raise ValueError(str(error).replace("BertConfig", "config.model")) from error


# The config.model key that sets each attention feature a model config decides.
_ATTENTION_KEYS = {
    "half_window": "local_attention_window",
    "causal": "causal",
    "dropout": "attention_probs_dropout_prob",
}


def check_model_config(config: ml_collections.ConfigDict) -> BertConfig:
    """``config.model`` as the run's BertConfig (the tokenizer's size and ids stood in for) and a
    forced attention kernel against every layer's attention in training, as far as the model
    config decides it (local windows, causal, dropout; packed rows and gathered queries are
    checked when the step is traced): raised naming config.model keys before anything is built."""
    cfg = _model_config(dict(config.model.to_dict()))
    forced = cfg.attention_implementation
    if forced is None:
        return cfg
    length = int(config.data.max_seq_length) if "data" in config else cfg.max_position_embeddings
    for layer in range(cfg.num_hidden_layers):
        spec = attention_kernels.AttentionSpec(
            1,
            length,
            length,
            cfg.num_attention_heads,
            cfg.head_dim,
            half_window=cfg.attention_window(layer),
            causal=cfg.causal,
            dropout=cfg.attention_probs_dropout_prob > 0,
        )
        reason = attention_kernels.BY_NAME[forced].cannot_serve(spec)
        if reason is not None:
            key = _ATTENTION_KEYS.get(reason.split("=")[0], "")
            setting = f" (config.model.{key}={config.model[key]!r})" if key else ""
            raise ValueError(
                f"config.model.attention_implementation={forced!r}: the {forced} kernel cannot "
                f"serve layer {layer}'s attention in training, {reason}{setting}; change that "
                "or leave attention_implementation unset to choose a kernel that can"
            )
    return cfg


def validate_run_config(config: ml_collections.ConfigDict) -> None:
    """Cross-field checks that no single sub-config can make, before anything is built: the
    model config (`check_model_config`), the optimizer and the objective's microbatches
    (`step.validate_step_config`), of every phase."""
    for key in ("num_train_steps", "batch_size", "log_every", "checkpoint_every", "eval_every"):
        positive = key in ("num_train_steps", "batch_size", "log_every")
        if int(config[key]) < 0 or (positive and int(config[key]) == 0):
            raise ValueError(f"config.{key}={config[key]!r}: must be positive")
    validate_tracking_config(config)
    if config.get("mlm_bias_init", "zeros") not in ("unigram", "zeros"):
        raise ValueError(
            f"config.mlm_bias_init={config.mlm_bias_init!r}: must be 'unigram' or 'zeros'"
        )
    if str(config.get("fit", "auto")) not in ("auto", "off"):
        raise ValueError(f"config.fit={config.fit!r}: must be 'auto' or 'off'")
    if float(config.get("fit_memory_gib", 0.0)) < 0:
        raise ValueError(f"config.fit_memory_gib={config.fit_memory_gib}: must be >= 0")
    if config.get("phase_order"):
        for phase in plan_phases(config):
            validate_run_config(phase.config)
        return
    if config.optim.total_steps != config.num_train_steps:
        logging.warning(
            "config.optim.total_steps=%s differs from num_train_steps=%s",
            config.optim.total_steps,
            config.num_train_steps,
        )
    if "model" in config:
        check_model_config(config)
    if not config.get("budget_flops"):  # a FLOP budget sets the schedule's length later
        validate_step_config(config)


# (config key, must exist): every path a run config may name; resolved where the config enters.
PATH_KEYS = (
    ("init_from", True),
    ("loss.teacher", True),
    ("data.tokenizer_model", True),
    ("data.hf_vocab", True),
    ("data.similar_words_file", True),
    ("data.store", False),  # a missing store's message (shard_format) says how to prepare it
    ("data.cache_dir", False),
    ("data.tfds_data_dir", False),
    ("task.train_file", True),
    ("task.dev_file", True),
    ("task.glue_dir", True),
    ("task.tfds_data_dir", False),
)


def resolve_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of ``config`` whose paths are resolved once (`bertjax.paths.resolve`: ``~``
    expanded, relative to the current directory, URLs kept), so nothing deeper sees a relative
    path; a path that must exist and does not raises MissingPathError naming the key."""
    config = config.copy_and_resolve_references()
    for key, must_exist in PATH_KEYS:
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node.get(parent) if hasattr(node, "get") else None
        if node is None or not node.get(leaf):
            continue
        node[leaf] = paths.resolve(node[leaf], f"config.{key}", must_exist=must_exist)
    corpus = config.data.get("corpus", "") if "data" in config else ""
    if corpus and corpus != "builtin" and not corpus.startswith("tfds:"):
        parts = [p.strip() for p in corpus.split(",") if p.strip()]
        config.data.corpus = ",".join(paths.resolve(p) for p in parts)
    if "data" in config and config.data.get("mixture"):
        config.data.mixture = tuple(
            (paths.resolve(url), weight) for url, weight in config.data.mixture
        )
    return config


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """``get_config()`` of a recipe file such as configs/bert_tiny.py (recipes build on others
    with it: ``load_config_file(os.path.join(os.path.dirname(__file__), "bert_tiny.py"))``).
    ``PATH:VARIANT`` (config_flags' form, as in ``--config=configs/bert_base.py:smoke``) passes
    VARIANT to ``get_config`` (see `recipe_variant`)."""
    path, _, variant = path.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    name = "_bertjax_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()


VARIANTS = ("", "smoke")


def recipe_variant(config: ml_collections.ConfigDict, variant: str) -> ml_collections.ConfigDict:
    """What every recipe's ``get_config(variant="")`` returns: the recipe as written (``""``) or
    its ``smoke`` variant (`smoke_config`), as big_vision's ``runlocal``:
    ``python train.py --config=configs/modernbert_base.py:smoke``."""
    if variant == "":
        return config
    if variant == "smoke":
        return smoke_config(config)
    raise ValueError(f"unknown recipe variant {variant!r}: the variants are {VARIANTS}")


def smoke_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The same recipe at toy sizes, for a minute on a laptop CPU and for the tests: 2 layers of
    width 32, 3 steps (every phase 2), batch 8 (16 where the batch ramps) in one microbatch,
    lengths scaled into [16, 64], a 400-piece tokenizer (320 for Chinese) trained on the run's
    corpus, warmup 1, a FLOP budget of a few steps, no warm start, an eval at the end, no
    checkpoint in between.
    Everything else (objective, data plan, optimizer, schedule, phases) is the recipe's own.
    Chinese recipes keep their corpus setting (there is no built-in Chinese corpus): pass
    ``--config.data.corpus``."""
    config.batch_size, config.num_train_steps = 8, 3
    width = config.model.hidden_size
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size, config.model.num_hidden_layers = 64, 2
    config.model.dtype = "float32"
    if config.model.embedding_size:
        config.model.embedding_size = 16
    longest = config.data.max_seq_length
    config.data.max_seq_length = 64 if config.data.length_schedule else 32
    config.data.length_schedule = tuple(
        (f, max(16, t * 64 // longest)) for f, t in config.data.length_schedule
    )
    config.model.max_position_embeddings = 64 + config.model.position_offset
    config.data.max_predictions = 6
    config.data.tokenizer_model = ""  # a small tokenizer trained on the recipe's corpus
    config.data.vocab_size = 320 if config.data.language == "zh" else 400
    if config.data.language == "zh":
        config.data.heldout_fraction = 0.2
    config.optim.warmup_steps = 1
    config.optim.warmup_tokens = config.optim.decay_tokens = 0
    config.optim.grad_accum_steps = 1  # a toy batch of 8 rows does not split into microbatches
    config.log_every, config.eval_every, config.eval_batches = 1, 3, 1
    config.checkpoint_every = 0
    config.progress_bar = False
    config.fast_compile = True  # a few steps: compiling is most of the run
    if config.batch_warmup.tokens or config.batch_warmup.budget_fraction:
        config.batch_size = 16  # batches of 8, then 16
        config.batch_warmup.update(tokens=min(config.batch_warmup.tokens, 32 * 8), quantum=8)
    if config.budget_flops:  # a few steps of the shrunken model
        config.budget_flops = 1.5e8
    config.init_from, config.init_tiling = "", False
    for loss in [config.loss] + [config.phases[n].set.get("loss", {}) for n in config.phase_order]:
        if loss.get("matryoshka_dims"):  # embedding widths shrink with the model (768 -> 32)
            loss.matryoshka_dims = tuple(max(1, d * 32 // width) for d in loss.matryoshka_dims)
    for name in config.phase_order:  # every phase two steps, its lengths shrunk the same way
        entry = config.phases[name]
        entry.steps, entry.tokens = 2, 0
        changes = entry.set
        if "batch_size" in changes:
            changes.batch_size = 8
        if "optim" in changes and "grad_accum_steps" in changes.optim:
            changes.optim.grad_accum_steps = 1  # one microbatch, as the whole run
        if "data" in changes and "max_seq_length" in changes.data:
            changes.data.max_seq_length = 64
            changes.data.max_predictions = 6
    return config


def config_path(argv, default: str) -> str:
    """The recipe file named by ``--config=PATH`` or ``--config PATH`` (absl takes both)."""
    path = default
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
    return path.split(":", 1)[0]  # config_flags' "file.py:argument" form


def objective_on_command_line(argv) -> str | None:
    """The objective ``--config.loss.objective=NAME`` (or ``... NAME``) names, the last one
    given; None when the command line leaves the recipe's."""
    name = None
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config.loss.objective="):
            name = arg.split("=", 1)[1]
        elif arg == "--config.loss.objective" and i + 1 < len(argv):
            name = argv[i + 1]
    return name


def load_recipe(path: str, argv) -> ml_collections.ConfigDict:
    """Recipe ``path`` (``PATH[:VARIANT]``) as the command line ``argv`` sees it before its
    overrides apply: made ready for the objective it names, or the recipe's own
    (`bertjax.objectives.with_objective`: that objective's settings exist, at their defaults)."""
    return with_objective(load_config_file(path), objective_on_command_line(argv))


class RecipeFileParser(config_flags.ConfigFileFlagParser):
    """config_flags' file parser, loading with `load_recipe` (then locked, so a typo fails)."""

    def __init__(self, name: str, argv=None):
        super().__init__(name=name, lock_config=True)
        self._argv = argv

    def parse(self, path):
        config = load_recipe(path, sys.argv if self._argv is None else self._argv)
        config.lock()
        return config


def define_config_flag(name, default, help_string, flag_values=flags.FLAGS, sys_argv=None):
    """``config_flags.DEFINE_config_file(name, default, help_string, lock_config=True)`` whose
    recipe is loaded by `load_recipe`: ``--config.loss.objective=X --config.loss.<X's
    setting>=v`` then sets a key the recipe itself does not have (train.py, bertjax.glue).
    config_flags has no public hook for its parser, so this builds its flag class itself."""
    flag = config_flags._ConfigFlag(  # the flag class DEFINE_config_file builds
        parser=RecipeFileParser(name, sys_argv),
        serializer=flags.ArgumentSerializer(),
        name=name,
        default=default,
        help_string=help_string,
        flag_values=flag_values,
        sys_argv=sys_argv,
    )
    return flags.DEFINE_flag(flag, flag_values)


def check_config_overrides(argv, default: str) -> None:
    """Names an unknown --config.KEY clearly (config_flags alone fails with a bare KeyError);
    call before config_flags parses ``argv``. ``default``: the recipe without --config. The
    objective the command line names is checked first, and its settings are keys."""
    path = config_path(argv, default)
    objective = objective_on_command_line(argv)
    if objective is not None and objective not in OBJECTIVES:
        cli.fail(f"--config.loss.objective={objective!r}: must be one of {sorted(OBJECTIVES)}")
    try:
        config = load_recipe(path, argv)
    except FileNotFoundError as error:
        cli.fail(str(error))
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        node, parts = config, arg[len("--config.") :].split("=", 1)[0].split(".")
        for depth, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node.keys():
                where = "config" + "".join(f".{p}" for p in parts[:depth])
                known = sorted(node.keys()) if hasattr(node, "keys") else []
                cli.fail(
                    f"unknown config key {'config.' + '.'.join(parts)!r} ({path}): "
                    f"{where} has no {part!r}; its keys are {known}"
                )
            node = node[part]
