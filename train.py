"""Pretrain a BERT-family encoder: python train.py [--config=configs/X.py] [--workdir=DIR].

With no arguments it runs the embedded default (configs/bert_tiny.py): BERT-tiny,
SentencePiece trained on the built-in corpus, MLM + NSP, on whatever devices JAX sees.
Override any config key on the command line: --config.optim.learning_rate=5e-4; switching the
objective (--config.loss.objective=distill) makes its settings keys (--config.loss.temperature=3).
Several processes (a TPU pod slice, GPU hosts): run the same command on every host with
--multihost; JAX finds Cloud TPU, SLURM, Open MPI and Kubernetes jobs by itself, elsewhere give
--coordinator_address (or JAX_COORDINATOR_ADDRESS), --num_processes and --process_id
(README: "Cloud storage, TPU pods and clusters").
Compiled programs are kept in JAX's persistent compilation cache (WORKDIR/compile_cache by
default, --config.compile_cache=DIR|URL|off; bertjax/training/compile_cache.py), so a restart
loads them instead of compiling again.
On Linux it first restarts itself with glibc malloc on transparent huge pages
(bertjax/training/runtime.py; ~1.3-1.5x faster steps on CPU; BERTJAX_HUGEPAGE_MALLOC=0 turns it
off).
"""

import json
import os
import signal
import sys
import traceback

from absl import app, flags, logging

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "bert_tiny.py")

if __name__ == "__main__":
    from bertjax.training.runtime import (
        default_to_cpu_without_accelerator,
        reexec_with_hugepage_malloc,
    )

    reexec_with_hugepage_malloc()
    default_to_cpu_without_accelerator()  # no TPU runtime start-up on a CPU host with libtpu
    from bertjax.training.run_config import check_config_overrides

    check_config_overrides(sys.argv, DEFAULT_CONFIG)  # before config_flags applies them

from bertjax import cli  # noqa: E402 (after the re-exec)
from bertjax.training.processes import HEARTBEAT_TIMEOUT_S  # noqa: E402
from bertjax.training.run_config import define_config_flag  # noqa: E402

# config_flags' locked --config file flag; the recipe comes ready for the objective that
# --config.loss.objective names, so that objective's settings are --config.loss keys
_CONFIG = define_config_flag(
    "config", DEFAULT_CONFIG, "Run config file (a get_config() -> ConfigDict)."
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    "workdir/bert_tiny",
    "Directory or URL (gs://, s3://, file://) for the tokenizer, checkpoints and metrics.",
)
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Join a run of several JAX processes (one per host) first."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "--multihost: HOST:PORT of process 0 (default: JAX_COORDINATOR_ADDRESS, else the cluster "
    "JAX detects: Cloud TPU, SLURM, Open MPI, Kubernetes).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "--multihost: how many processes the run has (default: detected)."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "--multihost: this process's index, 0 to num_processes - 1."
)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds",
    HEARTBEAT_TIMEOUT_S,
    "--multihost: seconds without a heartbeat before a process counts as lost and the others "
    "stop (JAX's default is 100).",
)


def main(argv):
    from bertjax.training import stopping

    stopping.command_mode()  # a signal ends this process in every phase (stopping.py)
    try:
        _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before the trainer took over signals
        stopping.leave_now(signal.SIGINT, "while starting; nothing was trained")
    except SystemExit as stop:  # bad input (2), storage unreachable (75): the line is printed
        if stop.code in (0, None):
            raise
        _leave(stop.code)
    except BaseException:  # a bug (1): its traceback
        traceback.print_exc()
        _leave(cli.BUG)


def _leave(status: int) -> None:
    """Exits with ``status`` without the interpreter's teardown, which would wait for a thread
    whose read hangs in storage (checkpoints are written and files closed by then)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments: {argv[1:]}")
    import jax

    if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
        logging.set_verbosity(logging.WARNING)
    from bertjax.training import processes

    if _MULTIHOST.value:
        try:
            processes.initialize(
                _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _HEARTBEAT.value
            )
        except processes.LaunchError as error:
            cli.fail(str(error))
    elif any(flag.present for flag in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID)):
        cli.fail("--coordinator_address, --num_processes, --process_id need --multihost")
    from bertjax import trainer
    from bertjax.training import stopping

    logging.info("devices: %s", jax.devices())
    with cli.input_errors(cli.absl_verbose()):  # bad input: one line (bertjax/cli.py)
        from bertjax.training import compile_cache

        if (cache := compile_cache.location(_CONFIG.value, _WORKDIR.value)) is not None:
            compile_cache.enable(cache)  # a restart loads what it compiled before
        try:
            summary = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
        except processes.MismatchError:  # raised by every process: they leave together
            processes.finish()
            raise
        except stopping.Interrupted as interrupted:  # before the first step: nothing to save
            stopping.leave_now(interrupted.signum, "before training; nothing was trained")
        except Exception as error:  # the others stop too, naming this process or a lost one
            processes.on_error(error)
            raise
    if jax.process_index() == 0:
        from bertjax.objectives import headline_metrics

        held_out = tuple(f"eval/{name}" for name in headline_metrics(_CONFIG.value))
        keys = ("step", "train/loss", *held_out, "perf/tokens_per_second", "perf/mfu")
        print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=2), flush=True)
    processes.finish()  # the processes leave together
    if summary["stopped_by_signal"]:  # saved, not done: a status that says "restart"
        status = cli.stopped_by(summary["signal"])
        name = signal.Signals(status - 128).name
        sys.stdout.flush()
        line = f"stopped by {name} after saving step {summary['step']} in {_WORKDIR.value}"
        print(f"{line}: rerun the same command to resume (exit status {status})", file=sys.stderr)
        _leave(status)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
