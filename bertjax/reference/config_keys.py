"""Every run-config key (``config.X``) with its default and meaning, read from the code that
declares it: the ``default_*_config`` functions and the recipes' helpers (each ``c.key = value``
with its comment), `BertConfig`'s fields (``config.model``) and each objective's dataclass
fields (its ``config.loss`` settings). docs/hooks.py renders `markdown()` as the site's
configuration reference; tests/reference_test.py fails when a key has no description."""

from __future__ import annotations

import dataclasses

import ml_collections

from bertjax.reference.comments import assigned_keys, field_comments


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: its dotted path under ``config``, its default and its meaning."""

    path: str
    default: object
    description: str
    objective: str = ""  # the objective whose setting it is ("": any run)


def _sections():
    """[(section title, key prefix, the runtime config holding its keys, builders)]: each builder
    a (function, the prefix of the keys it assigns) pair, searched in order for descriptions."""
    from bertjax.data import default_data_config
    from bertjax.data.plans import batch_plan
    from bertjax.evaluation.glue import default_glue_config
    from bertjax.objectives import base, embedding, finetune
    from bertjax.training import optim, phases, profiling, run_config, sharding, step, trackers

    run = run_config.default_run_config()
    finetuning = finetune.add_finetune_config(run_config.default_run_config(), "classification", 2)
    pairs = embedding.add_embedding_config(run_config.default_run_config())
    glue = ml_collections.ConfigDict({"glue": default_glue_config()})
    tracking = (trackers.add_tracking_config, "")
    top = [(run_config.default_run_config, ""), (step.default_step_config, ""), tracking]
    warmup = "batch_warmup"
    return [
        ("Run", "", run, top),
        ("Optimizer", "optim", run, [(optim.default_optim_config, "optim"), *top]),
        ("Mesh", "mesh", run, [(sharding.default_mesh_config, "mesh")]),
        ("Data", "data", run, [(default_data_config, "data")]),
        ("Batch warmup", "batch_warmup", run, [(batch_plan.default_batch_warmup_config, warmup)]),
        ("Loss (every objective)", "loss", run, [(base.default_loss_config, "loss")]),
        ("Fine-tuning task", "task", finetuning, [(finetune.default_task_config, "task")]),
        ("Embedding pairs", "pairs", pairs, [(embedding.default_pairs_config, "pairs")]),
        ("GLUE", "glue", glue, [(default_glue_config, "glue")]),
        ("Phases", "phases.NAME", _phase_example(phases.phase), [(phases.phase, "phases.NAME")]),
        ("Weights & Biases", "wandb", run, [tracking]),
        ("Profile", "profile", run, [(profiling.default_profile_config, "profile")]),
    ]


def _phase_example(phase) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"phases": {"NAME": phase()}})


def _leaves(config: ml_collections.ConfigDict, prefix: str = "") -> dict:
    """{dotted path: value} of every leaf of ``config`` (FieldReferences resolved to their
    source's path: ``optim.total_steps`` -> "= num_train_steps")."""
    out = {}
    for name in sorted(config.keys()):
        path = f"{prefix}{name}"
        value = config._fields[name]  # the raw field: a FieldReference stays one
        if isinstance(value, ml_collections.ConfigDict):
            if not value.keys():
                out[path] = {}
            out.update(_leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def _described(path: str, builders) -> str:
    """The first non-empty description of ``path`` among the builders' assignments."""
    for function, prefix in builders:
        keys = assigned_keys(function)
        relative = path[len(prefix) + 1 :] if prefix and path.startswith(prefix + ".") else path
        if prefix and not path.startswith(prefix + "."):
            relative = None
        if relative is not None and keys.get(relative):
            return keys[relative]
        if keys.get(path):  # assigned by its absolute path (default_run_config: optim.total_steps)
            return keys[path]
    return ""


def _glue_task_keys(glue_keys: dict) -> list[Key]:
    """``glue.TASK.KEY``: one row per key a task may override (its default: None = shared)."""
    from bertjax.evaluation.glue import TASK_KEYS

    rows = []
    for name in TASK_KEYS:
        shared = glue_keys[f"glue.{name}"].description
        rows.append(Key(f"glue.TASK.{name}", None, f"one task's own {name} (None: glue.{name}, "
                        f"{shared})"))  # fmt: skip
    return rows


def run_keys() -> list[Key]:
    """Every key outside the objectives' own settings and ``config.model``, section by section."""
    from bertjax.tasks.glue_tasks import TASKS

    keys: list[Key] = []
    for _title, prefix, config, builders in _sections():
        section = {}
        for path, value in _leaves(config).items():
            head = prefix.split(".")[0]
            if prefix == "" and "." in path:
                continue
            if prefix and path.split(".")[0] != head:
                continue
            if prefix == "glue" and path.split(".")[1] in TASKS:
                continue  # per-task overrides: one row per key below
            section[path] = Key(path, _default(value), _described(path, builders))
        keys.extend(section.values())
        if prefix == "glue":
            keys.extend(_glue_task_keys(section))
    return keys


def model_keys() -> list[Key]:
    """``config.model``: every `BertConfig` field a run config sets (the tokenizer sets the
    vocabulary size and special-token ids)."""
    from bertjax.modeling.bert_config import BertConfig
    from bertjax.training.run_config import _TOKENIZER_FIELDS, model_config_dict

    comments = field_comments(BertConfig)
    model = model_config_dict("tiny")
    return [
        Key(f"model.{name}", _default(model._fields[name]), comments.get(name, ""))
        for name in model.keys()
        if name not in _TOKENIZER_FIELDS
    ]


def objective_keys() -> list[Key]:
    """Each objective's own ``config.loss`` settings (beyond the shared loss keys), by objective."""
    from bertjax.objectives.registry import OBJECTIVES

    keys = []
    for name, cls in OBJECTIVES.items():
        comments = field_comments(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for setting in cls.extra_config_keys:
            default = fields[setting].default
            keys.append(Key(f"loss.{setting}", default, comments.get(setting, ""), name))
    return keys


def all_keys() -> list[Key]:
    return run_keys() + model_keys() + objective_keys()


def _default(value) -> object:
    """A key's default as a run sees it (a FieldReference's current value)."""
    return value.get() if isinstance(value, ml_collections.FieldReference) else value


def _cell(text: str) -> str:
    """``text`` safe in a markdown table cell."""
    for raw, safe in (("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*")):
        text = text.replace(raw, safe)
    return text


def _value(default) -> str:
    if default == {}:
        return "`{}`"
    return f"`{_cell(repr(default))}`"


def _table(keys: list[Key]) -> list[str]:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key in keys:
        lines.append(f"| `{key.path}` | {_value(key.default)} | {_cell(key.description)} |")
    return lines


def markdown() -> str:
    """The configuration reference page."""
    out = [
        "# Configuration reference",
        "",
        "Every key of the run config, generated from the code that declares it (each key's",
        "comment in the source is its meaning here). Set any of them on the command line:",
        "`python train.py --config.optim.learning_rate=5e-5`; a key that does not exist stops",
        "the run with the keys that do. A recipe (`configs/*.py`) starts from these defaults.",
        "",
    ]
    run = run_keys()
    for title, prefix, _config, _builders in _sections():
        if prefix:
            section = [k for k in run if k.path.startswith(prefix.split(".")[0] + ".")]
        else:
            section = [k for k in run if "." not in k.path]
        out += [f"## {title}", "", *_table(section), ""]
        if prefix == "":
            out += [
                "## Model (`config.model`, a `BertConfig`)",
                "",
                "Defaults are `default_run_config()`'s (BERT-tiny's sizes); the tokenizer sets",
                "the vocabulary size and the special-token ids.",
                "",
                *_table(model_keys()),
                "",
            ]
    out += [
        "## Each objective's settings",
        "",
        "Choosing an objective (`--config.loss.objective=NAME`) adds its settings to",
        "`config.loss` at these defaults, from any recipe.",
        "",
    ]
    by_objective: dict[str, list[Key]] = {}
    for key in objective_keys():
        by_objective.setdefault(key.objective, []).append(key)
    for name, keys in by_objective.items():
        out += [f"### `{name}`", "", *_table(keys), ""]
    return "\n".join(out)
