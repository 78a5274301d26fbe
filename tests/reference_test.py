"""The generated references of the docs site (bertjax/reference/): every config key a recipe can
set has a default and a description read from the code's comments, and every key of the batch
an objective reads is explained."""

import dataclasses
import os

from bertjax.objectives.registry import OBJECTIVES
from bertjax.reference import batch_keys, comments, config_keys
from bertjax.training.run_config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = config_keys.all_keys()


def test_every_config_key_has_a_description():
    """A key added without a comment beside it (or right above it) fails here, naming it."""
    missing = [k.path + (f" ({k.objective})" if k.objective else "") for k in KEYS]
    missing = [name for name, k in zip(missing, KEYS) if not k.description.strip()]
    assert not missing, f"config keys without a comment in the code that declares them: {missing}"


def _leaves(config, prefix=""):
    for name in config.keys():
        value = config[name]
        if hasattr(value, "keys") and value.keys():
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def _generic(path: str) -> str:
    """A recipe's own names in the reference's form: phases.NAME.*, glue.TASK.*."""
    parts = path.split(".")
    if parts[0] == "phases" and len(parts) > 2:
        return ".".join(["phases", "NAME", parts[2]])
    if parts[0] == "glue" and len(parts) == 3:
        return f"glue.TASK.{parts[2]}"
    return path


def test_the_reference_covers_every_key_of_every_recipe():
    documented = {k.path for k in KEYS}
    recipes = sorted(n for n in os.listdir(os.path.join(ROOT, "configs")) if n.endswith(".py"))
    assert len(recipes) >= 28
    for name in recipes:
        config = load_config_file(os.path.join(ROOT, "configs", name))
        for path in _leaves(config):
            if path.startswith("phases.") and ".set." in path:
                continue  # a phase's changes are run-config keys, documented above
            assert _generic(path) in documented, f"configs/{name}: {path} is not in the reference"


def test_every_objective_setting_is_listed_under_its_objective():
    listed = {(k.objective, k.path) for k in KEYS if k.objective}
    for name, cls in OBJECTIVES.items():
        for setting in cls.extra_config_keys:
            assert (name, f"loss.{setting}") in listed, (name, setting)


def _example(config):  # a builder of the kind the reference reads
    config.alpha = 1  # trailing words
    # a block
    # of two lines
    config.beta.gamma = "x"
    config.delta, config.epsilon = 2, 3  # both
    config.zeta = 4  # noqa: E501
    return config


@dataclasses.dataclass
class _Fields:
    width: int = 8  # the width
    # the depth,
    # above it
    depth: int = 2
    bare: int = 0


def test_descriptions_are_the_comments_beside_or_above_a_statement():
    assert comments.assigned_keys(_example) == {
        "alpha": "trailing words",
        "beta.gamma": "a block of two lines",
        "delta": "both",
        "epsilon": "both",
        "zeta": "",  # a tool directive is not a description
    }
    fields = {"width": "the width", "depth": "the depth, above it", "bare": ""}
    assert comments.field_comments(_Fields) == fields


def test_the_config_page_shows_defaults_and_escapes_table_cells():
    page = config_keys.markdown()
    assert "| `optim.learning_rate` | `0.0001` | base (peak) LR" in page
    assert "| `data.masking` | `'token'` | " in page
    assert '"token" \\| "whole_word"' in page  # a | inside a description stays in its cell
    for line in page.splitlines():
        if line.startswith("| `"):
            assert line.replace("\\|", "").count("|") == 4, line


def test_every_objective_s_batch_is_listed_and_each_key_explained():
    batches = batch_keys.objective_batches()
    assert set(batches) == set(OBJECTIVES)
    unexplained = {key for rows in batches.values() for key, _, _ in rows} - set(
        batch_keys.MEANINGS
    )
    assert not unexplained, f"batch keys without a line in batch_keys.MEANINGS: {unexplained}"
    pretraining = {key: (shape, dtype) for key, shape, dtype in batches["pretraining"]}
    assert pretraining["masked_positions"] == ("[B, P]", "int32")
    assert pretraining["next_sentence_label"] == ("[B]", "int32")
    assert dict((k, s) for k, s, _ in batches["diffusion"])["masked_ids"] == "[B, T]"
    assert dict((k, s) for k, s, _ in batches["embedding"])["doc_input_ids"] == "[B, K, T]"
    assert {d for rows in batches.values() for _, _, d in rows} <= {"int32", "float32"}
