"""The trainer behind train.py: the public face of `bertjax.training.trainer` and of the run
config (`bertjax.training.run_config`), which configs/*.py build on.

    summary = bertjax.trainer.train_and_evaluate(config, workdir)
"""

from bertjax.training.phases import phase
from bertjax.training.run_config import (
    default_run_config,
    load_config_file,
    model_config_dict,
    recipe_variant,
)
from bertjax.training.trainer import train_and_evaluate

__all__ = [
    "default_run_config",
    "load_config_file",
    "model_config_dict",
    "phase",
    "recipe_variant",
    "train_and_evaluate",
]
