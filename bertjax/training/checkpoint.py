"""Orbax checkpoints of the train state, with the run's config and tokenizer beside it.

Each checkpoint step holds two items: ``state`` (step, params, opt_state; sharded arrays,
restorable onto any mesh; never a frozen teacher) and ``meta`` (JSON: the run config, the model
config, the tokenizer file and fingerprint, the data's fingerprint). Reading one without the
trainer is `bertjax.interop.checkpoints`.

What a fault leaves behind is never resumed from:
- a save killed half-way (SIGKILL, a lost VM during an async save): orbax writes a step into a
  temporary directory and renames it when complete (on object stores, a commit file marks it), so
  it is never listed; the run resumes from the newest complete step and says which;
- a listed step whose bytes are bad (a file truncated or lost after the save completed,
  metadata that does not parse: bertjax/errors.py `shows_damage`, as every process that failed
  to read it says): the run resumes from the newest step that reads
  (`Checkpointer.restore_newest`), moves the bad one aside (``STEP.unreadable``, or
  ``STEP.unreadable.2`` beside an earlier one: nothing is ever deleted) and says so; a step that
  failed to read for another reason (memory, a bug, one host's trouble) is tried once more and
  the error reported, nothing moved;
- a save that cannot be written (a full disk): one line naming the step, the directory and the
  checkpoint that is intact (`CheckpointWriteError`, an OSError: exit status 2, since restarting
  does not free space); the previous checkpoints are untouched;
- storage that does not answer a save or a restore (TensorStore's UNAVAILABLE after its own ~15
  minutes of retries, a 503 through fsspec): `StorageUnavailable` (exit status 75: rerun), and a
  step that could not be reached is not set aside — it is not known to be bad.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from bertjax import errors, paths, retry
from bertjax.interop.checkpoints import ITEMS
from bertjax.modeling.bert_config import BertConfig
from bertjax.retry import StorageUnavailable


def _state_tree(state) -> dict:
    """What a checkpoint holds: never ``state.frozen`` (a distillation teacher, ~440 MB for a
    base model), which the objective reloads from its source on resume
    (`Objective.resume_state`)."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def _whole_shards_on_host_devices() -> None:
    """On one process whose devices are CPUs, saves write each shard whole instead of
    replica-parallel. Replica-parallel (orbax's default off GPUs) splits a replicated array
    among its replicas so that several hosts or accelerators share the device-to-host copy and
    the write; CPU devices already live in the host's memory, so the split only adds a
    ``jit(slice)`` compile per array shape and a copy (96 compiles, ~1.3 s, in every save of a
    2-layer BERT on 8 CPU devices). The files are the same either way."""
    if jax.process_count() == 1 and all(d.platform == "cpu" for d in jax.local_devices()):
        from orbax.checkpoint import type_handlers

        handler = type_handlers.get_type_handler(jax.Array)
        # Both are orbax's private attributes: where either is gone (another orbax), keep its
        # handler as it is rather than build one that might drop the array metadata store.
        if not all(hasattr(handler, a) for a in ("_use_replica_parallel", "_array_metadata_store")):
            return
        if handler._use_replica_parallel:
            type_handlers.register_type_handler(
                jax.Array,
                type_handlers.ArrayHandler(
                    use_replica_parallel=False, array_metadata_store=handler._array_metadata_store
                ),
                override=True,
            )


class _Manager(ocp.CheckpointManager):
    """orbax's manager that leaves JAX's preemption sync point to the trainer. orbax asks it
    (`reached_preemption`) with the step of each save, also from its background finalize
    thread after the loop has moved on; JAX's sync manager takes every call as this process's
    current step, so a late call would report an older step and the processes would agree on a
    stop step this one has passed (bertjax/training/stopping.py). It only chooses orbax's log
    line and metric of a preemption save."""

    def reached_preemption(self, step: int) -> bool:
        return False


# URL schemes orbax (0.12) writes checkpoints to; any other (s3://) fails inside its first save.
ORBAX_URLS = ("gs://",)
# what a write that failed for lack of room says (TensorStore's errors carry the errno in text)
_NO_ROOM = ("No space left on device", "os_error_code='28'", "Disk quota exceeded",
            "os_error_code='122'", "Read-only file system", "os_error_code='30'")  # fmt: skip
UNREADABLE = ".unreadable"  # the suffix of a listed step that could not be restored


class CheckpointWriteError(OSError):
    """A checkpoint could not be written for lack of room (the message names the step, the
    directory and the checkpoint that is intact)."""


class Checkpointer:
    """Periodic (async) saves under ``workdir/checkpoints``, keeping the last ``keep``."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = paths.resolve(directory)
        if paths.is_url(self.directory) and not self.directory.startswith(ORBAX_URLS):
            raise ValueError(
                f"checkpoints in {self.directory}: orbax writes arrays to local paths and "
                f"{', '.join(ORBAX_URLS)} only (TensorStore's file and gcs drivers); use such a "
                "workdir, or mount the bucket (e.g. mountpoint-s3, gcsfuse) and give its path"
            )
        _whole_shards_on_host_devices()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
        )
        self._manager = retry.call(  # it lists (and creates) the directory
            self.directory, _Manager, self.directory, options=options, item_names=ITEMS
        )
        self._pending: int | None = None  # the step of the last save started

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def saving(self) -> bool:
        """Whether an async save is still being written."""
        return self._manager.is_saving_in_progress()

    @contextlib.contextmanager
    def _writing(self, step: int | None):
        """Turns a write that failed for lack of room into one `CheckpointWriteError` line, and
        one storage did not answer (after TensorStore's own retries) into `StorageUnavailable`."""
        start = time.monotonic()
        try:
            yield
        except StorageUnavailable:
            raise
        except Exception as error:
            text = str(error)
            if (cause := errors.transient_cause(error)) is not None:  # storage did not answer
                where = f"{self.directory}/{step} (checkpoint save)"
                raise StorageUnavailable(where, cause, time.monotonic() - start, 1) from error
            if not any(sign in text for sign in _NO_ROOM):
                raise
            kept = [s for s in self.all_steps() if s != step]
            intact = f"step {max(kept)} is intact" if kept else "no earlier checkpoint exists"
            reason = next(sign for sign in _NO_ROOM if sign in text and "'" not in sign)
            raise CheckpointWriteError(
                f"cannot write checkpoint step {step} to {self.directory}: {reason.lower()}; "
                f"{intact}. Make room (or give another --workdir), then rerun the same command"
            ) from None

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, state, meta: dict, *, force: bool = False) -> bool:
        """Starts saving ``state`` at its step (returns at once when async)."""
        step = int(jax.device_get(state.step))
        if step in self._manager.all_steps():
            return False
        self._remove_unfinished(step)
        self._pending = step
        with self._writing(step):
            return self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(_state_tree(state)), meta=ocp.args.JsonSave(meta)
                ),
                force=force,
            )

    def _remove_unfinished(self, step: int) -> None:
        """Removes what a save killed half-way left of ``step`` (never listed, never resumed
        from): on object stores orbax writes a step in place and marks it complete with a
        commit file, so the leftovers would be written over."""
        self.wait()
        leftover = paths.join(self.directory, str(step))
        if jax.process_index() == 0 and paths.exists(leftover):
            logging.warning("removing %s, an unfinished save of step %d", leftover, step)
            paths.rmtree(leftover)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"bertjax-checkpoint-{step}")

    def wait(self) -> None:
        """Until the async save in flight is written (its error, if it failed, raised here)."""
        with self._writing(self._pending):
            self._manager.wait_until_finished()

    def read_meta(self, step: int | None = None) -> dict:
        step = self.latest_step() if step is None else step
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return restored["meta"]

    def restore(self, abstract_state, step: int | None = None) -> tuple[Any, dict]:
        """(state, meta) at ``step`` (default: latest), placed in ``abstract_state``'s shardings."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            _state_tree(abstract_state),
        )
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
                ),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"checkpoint {self.directory}/{step} does not fit this model/optimizer: {error}. "
                "Use the config it was saved with, or a new --workdir"
            ) from error
        tree = restored["state"]
        state = abstract_state.replace(
            step=tree["step"], params=tree["params"], opt_state=tree["opt_state"]
        )  # ``frozen`` stays as shapes and shardings: the objective's resume_state fills it
        return state, restored["meta"]

    def restore_newest(self, abstract_state, check: Callable[[dict], None]) -> tuple[Any, dict]:
        """(state, meta) of the newest step that can be read, placed as in `restore`; ``check``
        (meta) raises when a checkpoint does not suit this run (then no older one is tried: they
        were made by the same run). A newer step is moved aside (kept) only on evidence that
        its bytes are bad (bertjax/errors.py `shows_damage`: a missing or truncated chunk,
        unreadable metadata), as every process that failed to read it says; any other failure is
        tried once more and then raised (nothing moved), and storage that did not answer is
        `StorageUnavailable`. A warning names what was moved; when no step reads, the newest
        one's error is raised."""
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        damaged: list[tuple[int, BaseException]] = []
        for step in steps:  # each process makes the same calls: every decision is agreed on
            where = f"{self.directory}/{step} (checkpoint restore)"
            meta = _attempt(lambda step=step: self.read_meta(step), step, damaged, where)
            if meta is None:  # a truncated or lost meta file
                continue
            check(meta)
            restored = _attempt(
                lambda step=step: self.restore(abstract_state, step), step, damaged, where
            )
            if restored is not None:
                state, meta = restored
                break
        else:
            raise damaged[0][1]
        for bad, error in damaged:
            self._set_aside(bad, error, step)
        return state, meta

    def _set_aside(self, step: int, error: BaseException, resumed: int) -> None:
        """Moves listed step ``step``, whose bytes are bad, out of the manager's sight: to
        ``STEP.unreadable`` (``STEP.unreadable.2``, ... when an earlier one is there: none is
        ever deleted)."""
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        source = paths.join(self.directory, str(step))
        target = source + UNREADABLE
        if jax.process_index() == 0:
            n = 1
            while paths.exists(target):
                n += 1
                target = f"{source}{UNREADABLE}.{n}"
            paths.rename(source, target)
        if jax.process_count() > 1:
            from bertjax.training import processes

            target = processes.exchange("set-aside", target)[0]  # process 0's name for it
        retry.call(self.directory, self._manager.reload)
        logging.warning(
            "checkpoint step %d in %s could not be read (%s: %s); resumed from step %d; the "
            "unreadable one is kept as %s",
            step, self.directory, type(error).__name__, first, resumed, target,
        )  # fmt: skip

    def close(self) -> None:
        with self._writing(self._pending):
            self._manager.wait_until_finished()
        self._manager.close()


def _attempt(read: Callable, step: int, damaged: list, where: str):
    """``read()``, or None (the error added to ``damaged``) when its bytes are bad as every
    process that failed says; a read that failed for another reason is tried once more, then
    raised on every process (nothing is set aside); `StorageUnavailable` on every process when
    storage did not answer one of them (the step is not known to be bad)."""
    start = time.monotonic()
    out, error = _read(read)
    if error is not None and not _unreachable(error) and not errors.shows_damage(error):
        out, error = _read(read)  # not evidence of damage: once more (a passing fault)
    outcome = "ok"
    if error is not None:
        outcome = "unreachable" if _unreachable(error) else "failed"
        outcome = "damaged" if errors.shows_damage(error) else outcome
    outcomes = [outcome]
    if jax.process_count() > 1:
        from bertjax.training import processes

        outcomes = processes.exchange("checkpoint-read", outcome)
    if "unreachable" in outcomes:
        cause = errors.transient_cause(error) if outcome == "unreachable" else None
        cause = cause or OSError("storage did not answer a process's read (see its log)")
        raise StorageUnavailable(where, cause, time.monotonic() - start, 1) from error
    if "failed" in outcomes:
        if outcome == "failed":
            raise error
        failed = [i for i, o in enumerate(outcomes) if o == "failed"]
        raise RuntimeError(
            f"{where}: process {failed} could not read it for a reason that does not show "
            "damage (see its log); nothing was set aside"
        ) from error
    if "damaged" in outcomes:
        damaged.append((step, error or RuntimeError("another process found it damaged")))
        return None
    return out


def _read(read: Callable) -> tuple:
    try:
        return read(), None
    except Exception as error:  # noqa: BLE001  (told apart by the caller)
        return None, error


def _unreachable(error: BaseException) -> bool:
    return errors.classify(error) in (errors.Kind.STORAGE, errors.Kind.RESTART)


def check_compatible(
    meta: dict, model_cfg: BertConfig, tokenizer_fingerprint: str, directory: str
) -> None:
    """Refuses to resume from a checkpoint made with another tokenizer or model shape."""
    saved_tok = meta.get("tokenizer_fingerprint")
    if saved_tok and saved_tok != tokenizer_fingerprint:
        raise ValueError(
            f"checkpoint in {directory} was trained with tokenizer {saved_tok}, but this run's "
            f"tokenizer is {tokenizer_fingerprint}: use the same tokenizer or a new --workdir"
        )
    saved = meta.get("model_config", {})
    shape_fields = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "embedding_size",
        "num_hidden_groups",
        "scan_layers",
    )
    diffs = {
        k: (saved[k], getattr(model_cfg, k))
        for k in shape_fields
        if k in saved and saved[k] != getattr(model_cfg, k)
    }
    if diffs:
        raise ValueError(
            f"checkpoint in {directory} has a different model shape "
            f"(saved, now): {diffs}; use its config or a new --workdir"
        )
    logging.info("checkpoint in %s matches this run", directory)
