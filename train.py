"""Pretrain a BERT-family encoder: python train.py [--config=configs/X.py] [--workdir=DIR].

With no arguments it runs the embedded default (configs/bert_tiny.py): BERT-tiny,
SentencePiece trained on the built-in corpus, MLM + NSP, on whatever devices JAX sees.
Override any config key on the command line: --config.optim.learning_rate=5e-4.
On Linux it first restarts itself with glibc malloc on transparent huge pages
(bertjax/training/runtime.py; ~1.3-1.5x faster steps on CPU; BERTJAX_HUGEPAGE_MALLOC=0 turns it
off).
"""

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "bert_tiny.py")


def config_path(argv) -> str:
    """The recipe file named by ``--config=PATH`` or ``--config PATH`` (absl takes both)."""
    path = DEFAULT_CONFIG
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
    return path.split(":", 1)[0]  # config_flags' "file.py:argument" form


def check_overrides(argv) -> None:
    """Names an unknown --config.KEY clearly (config_flags alone fails with a bare KeyError)."""
    from bertjax.trainer import load_config_file

    path = config_path(argv)
    try:
        config = load_config_file(path)
    except FileNotFoundError as error:
        raise SystemExit(str(error)) from None
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        node, parts = config, arg[len("--config.") :].split("=", 1)[0].split(".")
        for depth, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node.keys():
                where = "config" + "".join(f".{p}" for p in parts[:depth])
                known = sorted(node.keys()) if hasattr(node, "keys") else []
                raise SystemExit(
                    f"unknown config key {'config.' + '.'.join(parts)!r} ({path}): "
                    f"{where} has no {part!r}; its keys are {known}"
                )
            node = node[part]


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()
    check_overrides(sys.argv)  # must run before DEFINE_config_file applies the overrides

_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "Run config file (a get_config() -> ConfigDict).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", "workdir/bert_tiny", "Directory for tokenizer, token store, checkpoints and metrics."
)
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Call jax.distributed.initialize() first (TPU pods, SLURM GPU clusters)."
)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
        logging.set_verbosity(logging.WARNING)
    if _MULTIHOST.value:
        jax.distributed.initialize()
    from bertjax import trainer

    logging.info("devices: %s", jax.devices())
    summary = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    if jax.process_index() == 0:
        keys = (
            "step",
            "train/loss",
            "eval/mlm_accuracy",
            "eval/majority_baseline",
            "eval/perplexity",
            "eval/nsp_accuracy",
            "eval/nll_bound",
            "eval/rtd_accuracy",
            "eval/rtd_auc",
            "perf/tokens_per_second",
            "perf/mfu",
        )
        print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=2))


if __name__ == "__main__":
    app.run(main)
