"""GLUE in one command: fine-tune one encoder on CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI and
RTE (WNLI optional), choose each task's learning rate by the median over seeds and write
OUT/glue_results.json; the public face of bertjax/evaluation/glue.py. Each run reports its dev
scores at the end of training (``--config.glue.report=best_on_dev``: the best evaluation).

Run: python -m bertjax.glue --workdir=OUT [--config=configs/glue.py]
         [--config.init_from=WORKDIR_OR_HF_DIR] [--config.KEY=VALUE ...]

The tasks come from the Hugging Face Hub: ``nyu-mll/glue``'s parquet files at a pinned commit
(``--config.task.glue_revision``; ``--config.task.glue_repo`` for a mirror), downloaded once
into the Hugging Face cache (``HF_HOME``), read from there offline (bertjax/tasks/glue_hub.py).
Offline without that cache: ``--glue_dir=DIR``, the standard GLUE download script's folders
(CoLA/, SST-2/, ...), or ``--glue_source=tfds``, prepared TFDS ``glue/*``
(``--config.task.tfds_data_dir``). From Python: ``results = bertjax.glue.run_glue(config,
glue_dir, workdir, source)``.
"""

from __future__ import annotations

import os
import sys

from bertjax import cli
from bertjax.evaluation.glue import GlueHarness, default_glue_config, run_glue
from bertjax.recipes import recipe_path
from bertjax.tasks.glue_tasks import GLUE_TASKS, TASKS

DEFAULT_CONFIG = recipe_path("glue.py")
__all__ = ["DEFAULT_CONFIG", "GLUE_TASKS", "TASKS", "default_glue_config", "main", "run_glue"]


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.glue`: absl flags --glue_dir, --workdir and a config file with
    --config.KEY=VALUE overrides (an unknown key stops with the keys that exist)."""
    from absl import app, flags, logging

    from bertjax.training.run_config import check_config_overrides, define_config_flag

    argv = list(sys.argv if argv is None else argv)
    check_config_overrides(argv, DEFAULT_CONFIG)  # before config_flags applies the overrides
    config = define_config_flag(
        "config", DEFAULT_CONFIG, "GLUE recipe (a get_config() -> ConfigDict).", sys_argv=argv
    )
    glue_dir = flags.DEFINE_string(
        "glue_dir", "", "GLUE download script's folder (CoLA/, SST-2/, ...); '': the Hub's."
    )
    glue_source = flags.DEFINE_string(
        "glue_source", "", "hub (nyu-mll/glue), dir (--glue_dir) or tfds; '': dir if --glue_dir"
    )
    workdir = flags.DEFINE_string(
        "workdir", None, "Output: runs/, glue_results.json, glue_results.md.", required=True
    )

    def run(args):
        if len(args) > 1:
            cli.fail(f"unexpected arguments: {args[1:]}")
        if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
            logging.set_verbosity(logging.WARNING)
        with cli.input_errors(cli.absl_verbose()):  # bad input: one line (bertjax/cli.py)
            from bertjax.training import compile_cache

            if (cache := compile_cache.location(config.value, workdir.value)) is not None:
                compile_cache.enable(cache)  # a grid's runs of one shape compile it once
            harness = GlueHarness(config.value, glue_dir.value, workdir.value, glue_source.value)
            harness.run()
        with open(os.path.join(harness.workdir, "glue_results.md")) as f:
            print(f.read())

    app.run(run, argv=argv, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    from bertjax.training import runtime

    runtime.reexec_with_hugepage_malloc()  # as train.py (bertjax/training/runtime.py)
    runtime.default_to_cpu_without_accelerator()
    main()
