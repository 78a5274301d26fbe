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

import collections
import contextlib
import logging
import math
import os
import time

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
from bertjax.training.stopping import Interrupted, StopRequests
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
        paths.Path(probe).unlink()
    except (OSError, ValueError) as error:
        raise ValueError(f"workdir {workdir!r} is not writable: {error}") from error
    return workdir


def evaluate(steps, state, data, mesh, config) -> dict:
    """Held-out metrics over fixed eval batches: the objective's metrics of the summed loss
    sums and normalizers (exact averages), what the objective adds from host-side counts summed
    over the processes (e.g. perplexity, a majority baseline), and task scores of the
    predictions (every row's, on every process)."""
    objective = state.spec.objective
    totals = None
    counts = collections.Counter()
    predictions = []
    for batch in data.eval_batches(int(config.eval_batches)):
        counts.update(objective.held_out_counts(batch))
        out = steps.eval(state, sharding.global_batch(batch, mesh, config.batch_size))
        parts = jax.device_get({"sums": out["sums"], "norms": out["norms"]})
        if "predictions" in out:  # fine-tuning: task metrics need every dev prediction on host
            predictions.append(jax.device_get(out["predictions"]))
        totals = parts if totals is None else jax.tree.map(np.add, totals, parts)
    if totals is None:
        return {}
    report = objective.report(totals["sums"], totals["norms"])
    counts = processes.sum_counters(counts)  # each host counted its own rows
    result = objective.held_out_metrics({k: float(v) for k, v in report.items()}, counts)
    if predictions:
        result.update(data.score(np.concatenate(predictions)))
    return result


class _LogWindow:
    """Tokens and model FLOPs of the steps since the last log line, for tokens/s and MFU."""

    def __init__(self, config, model_cfg, objective, peak: float):
        self.config, self.model_cfg, self.objective, self.peak = config, model_cfg, objective, peak
        self.num_devices = jax.device_count()
        self.restart()

    def restart(self) -> None:
        self.tokens = self.flops = 0.0
        self.start = time.perf_counter()
        self.storage = retry.COUNTS.snapshot()

    def add(self, host_batch: dict, batch_size: int) -> None:
        """Estimates of the global batch from this host's rows (its count x the processes); the
        mean of the processes' estimates (`scalars`) is the exact global count."""
        self.tokens += float(np.sum(host_batch["attention_mask"])) * jax.process_count()
        self.flops += self.objective.batch_flops(
            self.model_cfg, host_batch, batch_size, metrics_lib.train_flops_per_sequence
        )

    def scalars(self, steps: int) -> dict:
        """perf/* of the window's ``steps`` steps, and storage/*: the requests of the processes
        (the data workers' not counted) that failed in the window and were retried, and those
        that then succeeded; starts a new window."""
        elapsed = time.perf_counter() - self.start
        now = retry.COUNTS.snapshot()
        failed, recovered = (now[k] - self.storage[k] for k in ("failed", "recovered"))
        tokens, flops, failed, recovered = processes.sum_numbers(
            [self.tokens, self.flops, failed, recovered]
        )
        tokens, flops = tokens / jax.process_count(), flops / jax.process_count()
        out = {
            "perf/tokens_per_second": tokens / elapsed,
            "perf/steps_per_second": steps / elapsed,
            "perf/mfu": metrics_lib.mfu(
                flops / steps, elapsed / steps, self.num_devices, self.peak
            ),
            "storage/failed_requests": int(failed),
            "storage/recovered_requests": int(recovered),
        }
        self.restart()
        return out


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
        self.config, self.workdir, self.stop = config, workdir, stop
        self.writer, self.phases = trackers, phases
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
        self.window = _LogWindow(config, self.model_cfg, self.objective, peak)
        self.history, self.unchecked, self.summary = [], [], {}
        self.progress = None
        self.profile = None  # config.profile's trace (bertjax/training/profiling.py)
        self.abandon_reads = False  # stopping: reads ahead that wait to retry give up

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
            self.abandon_reads = True
            if jax.process_count() == 1:  # several: the others wait in the step (processes.py)
                self._save_unsaved("storage unreachable")
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

    def _unsaved(self) -> bool:
        """Steps trained since the last checkpoint, or a checkpoint still being written."""
        return self.current != self.saved or self.ckpt.saving()

    def _save_unsaved(self, why: str) -> None:
        """Saves the state (one process: a stop outside a step) when steps were trained since
        the last checkpoint, and says so."""
        if self.current != self.saved:
            if self.history:
                self._log(self.current)
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
            self._log(done)
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

    def _log(self, done: int) -> None:
        fetched = jax.device_get(self.history)
        self.history = []
        skipped = self._check_finite(done)
        scalars = {f"train/{k}": v for k, v in metrics_lib.mean_metrics(fetched).items()}
        scalars["train/skipped_updates"] = skipped
        scalars.update(self.window.scalars(len(fetched)))
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

    def close(self) -> None:
        if self.profile is not None:
            self.profile.close(self.state)
        if self.progress is not None:
            self.progress.close()
        self.ckpt.close()
        if self.abandon_reads or self.stop.received is not None:  # saved: no read is needed
            retry.stop()  # one waiting out a backoff gives up now, not after the budget
        if self.best is not None:
            self.best.close()
        self.writer.flush()  # the trackers stay open for the next phase
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
    stop = StopRequests()
    retry.resume()  # an earlier run in this process may have stopped
    trackers = Trackers.open(config, workdir, enabled=jax.process_index() == 0)
    try:
        while True:
            try:
                summary = _train_phases(phases, workdir, stop, trackers)
                trackers.finish(summary)
                return summary
            except EarlierCheckpoint:
                if stop.synced:  # JAX's sync point counted from the newer step: a rerun (75)
                    raise
                logging.warning("a checkpoint was set aside: the phases are planned again")
    except BaseException as error:
        trackers.fail(error)
        raise
    finally:
        trackers.close()
        stop.restore()


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
