"""`train_and_evaluate(config, workdir)`: the training loop behind `train.py`.

The loop only moves data and calls the jitted step: batch `s` comes from the data source
as a pure function of the step, metrics stay on device until a log step, checkpoints are
written asynchronously, and a restart resumes from the last complete checkpoint with
bit-identical results. SIGTERM/SIGINT to any process save one step on every process and stop
(bertjax/training/stopping.py); numbers a host computes from its own rows (held-out counts, the
tokens of a log window) are summed over the processes before they are used, so every process
logs what one process would (bertjax/training/processes.py). The objective decides
the data source and how a fresh state is prepared; the data source may ask for the best
checkpoint by a dev metric to be kept (WORKDIR/best).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal

import jax
import ml_collections
import numpy as np

from bertjax import objectives, paths, retry
from bertjax.aot import chips
from bertjax.aot import fit as fit_lib
from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.modeling import attention_kernels
from bertjax.objectives.warm_start import with_source_tokenizer
from bertjax.ops import cudnn_dropout, dropout_check
from bertjax.retry import StorageUnavailable
from bertjax.training import metrics as metrics_lib
from bertjax.training import phases as phases_lib
from bertjax.training import processes, sharding
from bertjax.training import step as step_lib
from bertjax.training.best import BestCheckpoint
from bertjax.training.checkpoint import Checkpointer
from bertjax.training.profiling import StepProfile
from bertjax.training.resume import EarlierCheckpoint, checkpoint_meta, restore_or_init
from bertjax.training.run_config import model_config, resolve_paths, validate_run_config
from bertjax.training.run_metrics import LogWindow, evaluate
from bertjax.training.stopping import (
    METRICS_WAIT_S,
    SAVE_WAIT_S,
    STUCK_WAIT_S,
    Interrupted,
    StoppedApart,
    StopRequests,
    bounded,
)
from bertjax.training.trackers import Trackers


def _prepare_workdir(workdir: str) -> str:
    """The resolved workdir (a local path or a URL), created and probed for writing by process 0."""
    workdir = paths.resolve(workdir, "--workdir")
    if jax.process_index() != 0:
        return workdir
    probe = paths.join(workdir, f".write-test-{os.getpid()}")
    try:
        paths.makedirs(workdir)
        paths.write_text(probe, "ok")
        paths.remove(probe)
    except (OSError, ValueError) as error:  # a transient cause stays one (bertjax/errors.py)
        raise ValueError(f"workdir {workdir!r} is not writable: {error}") from error
    return workdir


class _Run:
    """One call of `train_and_evaluate`: its parts, the loop, and the cadence of logging,
    evaluation and checkpoints."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        phase,
        stop: StopRequests,
        planned,
        trackers: Trackers,
        phases: list,
    ):
        self.stop, self.abandon_reads = stop, False
        self.writer, self.phases = trackers, phases  # the run's: open across its phases
        self.data = self.ckpt = self.best = self.progress = self.profile = None
        try:
            self._open(config, workdir, phase, stop, planned)
        except BaseException:  # setup failed (a checkpoint set aside, a signal): close its parts
            self.close(setup_failed=True)
            raise

    def _open(self, config, workdir: str, phase, stop: StopRequests, planned) -> None:
        self.config, self.workdir, self.stop = config, workdir, stop
        self.phase = phase or phases_lib.plan_phases(config)[0]
        self.is_chief = jax.process_index() == 0
        self.objective = objectives.make_objective(config)
        if not self.objective.loads_init_from:
            config = self.config = with_source_tokenizer(config)
        self.data = self.objective.make_data(config, workdir)
        self.model_cfg = self.data.model_config() or model_config(config, self.data.tokenizer)
        if config.get("budget_flops"):  # the run's length from its FLOP budget (cramming)
            config = self.config = phases_lib.apply_flop_budget(
                config, self.model_cfg, self.objective
            )
            self.phase = phases_lib.plan_phases(config)[0]
            self.data.close()
            self.data = self.objective.make_data(config, workdir)
            logging.info("config.budget_flops: %d steps", config.num_train_steps)
        # microbatches, remat and FSDP fitted to these devices' memory (bertjax/aot/fit.py)
        config, self.fit = fit_lib.fit_run(config, self.model_cfg, workdir)
        self.config = config
        self.model_cfg = fit_lib.with_model_remat(self.model_cfg, config)
        if self.fit is not None and self.is_chief:
            print(self.fit.describe(), flush=True)
        self.mesh = sharding.make_mesh(config.mesh)
        self._check_gpu_dropout()
        self.ckpt = Checkpointer(
            paths.join(workdir, "checkpoints"),
            keep=int(config.keep_checkpoints),
            async_save=bool(config.async_checkpoints),
        )
        self._check_batch_sizes()
        self.state = restore_or_init(
            config, self.objective, self.data, self.model_cfg, self.mesh, self.ckpt, self.phase,
            planned,
        )  # fmt: skip
        self.steps = step_lib.jit_steps(self.state, self.mesh, step_lib.compiler_options(config))
        self.meta = checkpoint_meta(config, self.model_cfg, self.data)
        if self.fit is not None:  # what this hardware ran with; a resume elsewhere may differ
            self.meta["fit"] = self.fit.to_dict()
        self.best = None
        if self.data.dev_metric:
            self.best = BestCheckpoint(workdir, self.data.dev_metric)
        peak = metrics_lib.peak_flops(float(config.peak_flops_per_device))
        self.window = LogWindow(config, self.model_cfg, self.objective, peak)
        self.history, self.unchecked, self.summary = [], [], {}

    def _check_gpu_dropout(self) -> None:
        """On GPUs, whether cuDNN's attention dropout drops in its backward what its forward
        dropped (`dropout_check.startup`): off for the run, on every process, if any process's
        check failed (the processes compile one program)."""
        platform_name = self.mesh.devices.flat[0].platform
        if dropout_check.startup_applies(platform_name, self.model_cfg):
            line = dropout_check.startup(platform_name, self.model_cfg)
            if processes.sum_numbers([1.0 if line else 0.0])[0] and line is None:
                line = "attention dropout: another process's start-up check failed"
                cudnn_dropout.disable(line)
            if line and self.is_chief:
                print(line, flush=True)

    def _check_batch_sizes(self) -> None:
        """Every batch size of the run divides over the hosts, the mesh's batch shards and the
        microbatches (checked now, not when a growing batch first reaches a size)."""
        length = int(self.config.data.max_seq_length) if "data" in self.config else 1
        plan = BatchPlan.from_config(self.config, length)
        sizes = {*plan.sizes, plan.final}
        accumulate = int(self.config.optim.grad_accum_steps)
        for size in sorted(sizes):
            sharding.process_batch_rows(self.mesh, size)
            shards = math.prod(self.mesh.shape[a] for a in sharding.BATCH_AXES)
            if size % (accumulate * shards):
                raise ValueError(
                    f"global batch {size} does not split into {accumulate} microbatches over "
                    f"{shards} batch shards: make config.batch_warmup.quantum (and "
                    "config.batch_size) a multiple of grad_accum_steps x the batch shards"
                )

    def train(self) -> dict:
        config = self.config
        phase = self.phase
        total = phase.end
        start = int(jax.device_get(self.state.step))
        self.writer.start(start, phase, self.phases)
        self.profile = StepProfile(config, self.workdir, start, self._say)
        if self.is_chief and config.progress_bar and start < total:
            from tqdm.auto import tqdm

            self.progress = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        dropout_rng = jax.random.key(config.seed + 1)
        self.window.restart()
        self.data.end_at(total - phase.start)  # no reads ahead past the phase's last step
        stopped = self.stop.reached(start)  # a request that came before the first step
        self.current = self.saved = start
        self.stop.unsaved, self.stop.training = self._unsaved, True
        try:
            while self.current < total and not stopped:
                self._step(dropout_rng, start)
                stopped = self._after_step(self.current, total)
            if start >= total and config.eval_every:  # already trained: report held-out metrics
                with self.stop.interruptible():
                    self.summary.update(self._evaluate())
        except Interrupted as signal_stop:  # outside a step: the state is the last step's
            self._save_unsaved(f"stopped by {signal_stop}")
            stopped = signal_stop.signum
        except StorageUnavailable:  # the batch never came: the state is the last step's
            stop_requested = self.stop.stopping_together()  # a stop came during the outage
            self.abandon_reads = True
            self.stop.token.cancel()  # nothing on the way out waits on storage any more
            if stop_requested:  # (several processes; one process stops through Interrupted)
                stopped = self._stop_where_stuck()
            elif jax.process_count() == 1:  # several: the others wait in the step (processes.py)
                bounded(lambda: self._save_unsaved("storage unreachable"), SAVE_WAIT_S,
                        f"saving step {self.current} after storage stopped answering")  # fmt: skip
                raise
            else:
                raise
        finally:
            self.stop.training = False
        self.summary["step"] = int(jax.device_get(self.state.step))
        self.summary["stopped_by_signal"] = bool(stopped)
        self.summary["signal"] = self.stop.received
        return self.summary

    def _step(self, dropout_rng, start: int) -> None:
        """Reads the batch of step ``self.current`` (interruptible: nothing has changed yet) and
        dispatches the step (a signal then waits for its end)."""
        within = self.current - self.phase.start  # the phase's data and plan count from its start
        self.profile.before(self.current, self.state)  # config.profile: a trace starts
        with self.stop.interruptible():
            host_batch = self.data.batch(within)
        size = self.data.step_batch_size(within) or self.config.batch_size
        self.window.add(host_batch, size)
        batch = sharding.global_batch(host_batch, self.mesh, size)
        first = self.current == start  # traced then: record the kernel each attention gets
        with attention_kernels.recording() if first else contextlib.nullcontext() as traced:
            self.state, step_metrics = self.steps.train(self.state, batch, dropout_rng)
        self.current += 1
        self.profile.after(self.current, self.state)  # and stops when its last step is done
        if traced and self.is_chief:
            self._say("attention: " + "; ".join(attention_kernels.summary(traced)))
            devices = list(self.mesh.devices.flat)  # a T4 set to bfloat16: what to set
            if advice := chips.dtype_advice(str(self.config.model.get("dtype", "")), devices):
                self._say(advice)
        self.history.append(step_metrics)
        self.unchecked.append(step_metrics)

    def _stop_where_stuck(self) -> int:
        """A stop came while this process's batch did not (storage out, a hung read): when
        every process is stuck at the same step, they save it together; otherwise the step some
        process has passed cannot complete, and this one stops without saving
        (`stopping.StoppedApart`: 143, the others follow)."""
        steps = processes.gather("stuck", self.current, STUCK_WAIT_S)
        if steps is None or len(set(steps)) > 1:
            raise StoppedApart(self.current, self.saved, steps)
        self._save_unsaved("stopped while storage did not answer")
        return signal.SIGTERM

    def _unsaved(self) -> bool:
        """Steps trained since the last checkpoint, or a checkpoint still being written."""
        return self.current != self.saved or self.ckpt.saving()

    def _save_unsaved(self, why: str) -> None:
        """Saves the state (a stop outside a step) when steps were trained since the last
        checkpoint, and says so; its metrics are written without waiting on storage."""
        if self.current != self.saved:
            if self.history:
                self._log(self.current, stopping=True)
            self._check_finite(self.current)
            self.ckpt.save(self.state, self.meta, force=True)
            self.saved = self.current
        self.ckpt.wait()
        logging.warning("%s: step %d is saved in %s", why, self.saved, self.ckpt.directory)

    def _say(self, line: str) -> None:
        """One line of train.py's output (above the progress bar when there is one)."""
        (self.progress.write if self.progress is not None else print)(line)

    def _after_step(self, done: int, total: int) -> bool:
        """Logging, evaluation and checkpoints due after step ``done``; True: stop now."""
        config = self.config
        last = done == total
        within = done - self.phase.start  # cadences count from the phase's start
        # Asked once per step, on every process: a request that lands later is handled at a
        # later step, so a stop always saves first, and every process stops at the same step.
        stopping = self.stop.reached(done)
        if within % config.log_every == 0 or last or stopping:
            self._log(done, stopping)
        if self.progress is not None:
            self.progress.update(1)
        if config.eval_every and (within % config.eval_every == 0 or last):
            self._eval(done)
        every = config.checkpoint_every
        if (every and within % every == 0) or last or stopping:
            self._check_finite(done)
            self.ckpt.save(self.state, self.meta, force=True)
            self.saved = done
        if stopping:
            logging.warning(
                "stop requested (a signal to this or another process): saved step %d, stopping",
                done,
            )
        return stopping

    def _log(self, done: int, stopping: bool = False) -> None:
        """Logs the steps since the last log line; ``stopping``: the write waits at most
        `METRICS_WAIT_S` on storage (the save comes next)."""
        fetched = jax.device_get(self.history)
        self.history = []
        skipped = self._check_finite(done)
        scalars = {f"train/{k}": v for k, v in metrics_lib.mean_metrics(fetched).items()}
        scalars["train/skipped_updates"] = skipped
        scalars.update(self.window.scalars(len(fetched)))
        if stopping:
            bounded(lambda: self.writer.write_scalars(done, scalars), METRICS_WAIT_S,
                    f"writing the metrics of step {done}", raises=False)  # fmt: skip
        else:
            self.writer.write_scalars(done, scalars)
        self.summary.update(scalars)
        if self.progress is not None:
            self.progress.set_postfix(
                loss=f"{scalars['train/loss']:.3f}",
                tok_s=f"{scalars['perf/tokens_per_second']:.0f}",
                mfu=f"{scalars['perf/mfu']:.1%}",
            )

    def _check_finite(self, done: int) -> int:
        """Fetches pending non-finite flags; stops the run before bad params are saved."""
        flags = jax.device_get([m["nonfinite"] for m in self.unchecked])
        self.unchecked.clear()
        bad = int(np.sum(flags))
        if bad and not self.config.skip_nonfinite_updates:
            self.ckpt.wait()
            raise FloatingPointError(
                f"non-finite loss or gradient at or before step {done}; the last good checkpoint "
                f"({self.ckpt.latest_step()}) in {self.ckpt.directory} is kept. Lower the "
                "learning rate, check the data, or set --config.skip_nonfinite_updates=True"
            )
        return bad

    def _evaluate(self) -> dict:
        result = evaluate(self.steps, self.state, self.data, self.mesh, self.config)
        return {f"eval/{k}": v for k, v in result.items()}

    def _eval(self, done: int) -> None:
        with self.stop.interruptible():  # a signal stops the evaluation, not the bookkeeping
            result = self._evaluate()
        self.writer.write_scalars(done, result)
        self.summary.update(result)
        if result and self.is_chief:
            line = " ".join(f"{k[5:]}={v:.4g}" for k, v in result.items())
            self._say(f"step {done}: {line}")
        if result and self.best is not None:
            self.best.update(done, result, self.state, self.meta, self.data.write_predictions)
        self.window.restart()  # eval time is not training throughput

    def close(self, setup_failed: bool = False) -> None:
        """Closes what the run opened (the trackers stay open for the next phase: flushed).
        After a stop or an outage nothing waits on storage or on a hung read past a deadline
        (the run's token is cancelled: reads still waiting out a backoff give up); after a
        failed setup (a checkpoint set aside: the run is planned again with the same token) the
        checkpoints are closed within a deadline too."""
        stopping = self.abandon_reads or self.stop.received is not None
        stopping = stopping or self.stop.token.cancelled()
        if stopping:  # saved: no read is needed
            self.stop.token.cancel()
        if self.profile is not None:
            self.profile.close(self.state)
        if self.progress is not None:
            self.progress.close()
        if self.ckpt is not None:
            if stopping or setup_failed:
                bounded(self.ckpt.close, SAVE_WAIT_S, "closing the checkpoints", raises=False)
            else:
                self.ckpt.close()
        if self.best is not None:
            self.best.close()
        if stopping:
            bounded(self.writer.flush, METRICS_WAIT_S, "writing the metrics", raises=False)
        else:
            self.writer.flush()
        if self.data is not None:
            self.data.close()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains as configured, resuming from ``workdir`` if it holds checkpoints.

    Args:
      config: a run config (`bertjax.training.run_config.default_run_config`, or a recipe's
        ``get_config()`` from configs/).
      workdir: a directory or URL (gs://...) for the tokenizer, checkpoints and metrics.

    Returns:
      The last train and eval metrics (``step``, ``train/loss``, ``eval/mlm_accuracy``, ...,
      ``phase``, ``stopped_by_signal``).
    """
    processes.check_same("config", {"config": config.to_dict(), "workdir": workdir})
    config = resolve_paths(config)  # a missing path first, then conflicts between keys
    validate_run_config(config)
    workdir = _prepare_workdir(workdir)
    phases = phases_lib.plan_phases(config)
    token = retry.Cancel()  # this run's: cancelled by its first signal, gone when it returns
    stop = StopRequests(token)
    trackers = Trackers.open(config, workdir, enabled=jax.process_index() == 0)
    try:
        with retry.scope(token):
            summary = _train_retrying(phases, workdir, stop, trackers)
        trackers.finish(summary)
        return summary
    except BaseException as error:
        trackers.fail(error)
        raise
    finally:
        if token.cancelled():  # a stop or an outage: the trackers' last writes wait a bound
            bounded(trackers.close, METRICS_WAIT_S, "closing the trackers", raises=False)
        else:
            trackers.close()
        stop.restore()


def _train_retrying(phases: list, workdir: str, stop: StopRequests, trackers: Trackers) -> dict:
    """`_train_phases`, planned again after a checkpoint was set aside."""
    while True:
        try:
            return _train_phases(phases, workdir, stop, trackers)
        except EarlierCheckpoint:
            if stop.synced:  # JAX's sync point counted from the newer step: a rerun (75)
                raise
            logging.warning("a checkpoint was set aside: the phases are planned again")


def _train_phases(phases: list, workdir: str, stop: StopRequests, trackers: Trackers) -> dict:
    """Trains the phases not finished yet (all of a one-phase run) from the newest checkpoint."""
    done = None
    if len(phases) > 1 or stop.synced:
        probe = Checkpointer(paths.join(workdir, "checkpoints"), async_save=False)
        done = probe.latest_step()
        probe.close()
    if stop.synced:  # JAX's sync point counts from the step the run resumes at
        stop.reached(done or 0)
    summary: dict = {}
    for phase in phases:
        if done is not None and done >= phase.end and phase is not phases[-1]:
            continue  # finished in an earlier call
        if len(phases) > 1:
            logging.info("phase %r: steps %d to %d", phase.name, phase.start, phase.end)
        with stop.interruptible():  # preparing data, restoring, compiling: nothing to save
            run = _Run(phase.config, workdir, phase, stop, done, trackers, phases)
        try:
            summary = run.train()
        finally:
            run.close()
        summary["phase"] = phase.name
        if summary["stopped_by_signal"]:
            break
        done = None  # the next phase starts from this one's last checkpoint, as planned
    return summary
