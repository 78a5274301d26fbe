"""Where a run's metrics go (``config.trackers``): TensorBoard event files (through tensorboardX,
no TensorFlow), ``metrics.jsonl``, and Weights & Biases (`bertjax.training.wandb_tracker`).

Process 0 writes every tracker; the other processes hold none (their numbers are summed into
process 0's before they are logged). The trackers live for one `train_and_evaluate` call: they
open before the first phase, hear each phase start (`Trackers.start`), every log and eval line
(`write_scalars`) and the final summary (`finish`), and close when the call ends. The run's id
(`bertjax.training.run_record`) names it to W&B, so a restarted run continues its W&B run.

    config.trackers = "tensorboard,jsonl,wandb"   # or --config.trackers=wandb
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping

import ml_collections

from bertjax import paths
from bertjax.training import run_record
from bertjax.training.tracker_base import Tracker

TRACKERS = ("tensorboard", "jsonl", "wandb")


def add_tracking_config(config: ml_collections.ConfigDict) -> None:
    """The run config's tracking keys: ``trackers``, ``wandb`` and ``profile``."""
    from bertjax.training.profiling import default_profile_config

    # comma-separated, written by process 0: tensorboard (event files in the workdir), jsonl
    # (WORKDIR/metrics.jsonl), wandb (Weights & Biases; pip install 'bertjax[wandb]')
    config.trackers = "tensorboard,jsonl"
    config.wandb = ml_collections.ConfigDict()
    config.wandb.project = ""  # "" = $WANDB_PROJECT, else "bertjax"
    config.wandb.entity = ""  # "" = $WANDB_ENTITY, else your default entity
    config.wandb.name = ""  # the W&B run's display name; "" = the workdir's last part
    config.wandb.tags = ""  # comma-separated tags
    config.profile = default_profile_config()


def chosen(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The configured trackers, checked: known names, once each; wandb importable."""
    value = config.get("trackers", "tensorboard,jsonl")
    if not isinstance(value, str):  # a tuple given in a recipe
        value = ",".join(value)
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in TRACKERS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"config.trackers={value!r}: name each of {', '.join(TRACKERS)} at most once, "
            "separated by commas (e.g. tensorboard,wandb)"
        )
    if "wandb" in names:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ValueError(
                "config.trackers names wandb, which is not installed: pip install "
                "'bertjax[wandb]' (or drop wandb from config.trackers)"
            ) from None
    return names


def validate_tracking_config(config: ml_collections.ConfigDict) -> None:
    """``config.trackers`` (`chosen`) and ``config.profile``, when the config has them."""
    from bertjax.training.profiling import validate_profile_config

    if "trackers" in config:
        chosen(config)
    if "profile" in config:
        validate_profile_config(config.profile)


class _ObjectFile:
    """A growing file on an object store (gs://, s3://, ...) written through epath: objects
    cannot be appended to, so each flush rewrites the object with everything written so far
    (``initial`` is what the object already held, so a resumed run keeps it)."""

    def __init__(self, path: str, initial: bytes = b""):
        self.path, self.data, self.dirty = path, bytearray(initial), False

    def write(self, data: bytes) -> None:
        self.data += data
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            paths.write_bytes(self.path, bytes(self.data))
            self.dirty = False

    def close(self) -> None:
        self.flush()


class _EventObjects(_ObjectFile):
    """An event file on an object store that continues in a new object (``path.1``, ...) once
    it holds ~1 MB, so a flush never rewrites much; TensorBoard reads every event file."""

    ROLL_BYTES = 1 << 20

    def __init__(self, path: str):
        super().__init__(path)
        self.base, self.part = path, 0

    def flush(self) -> None:
        super().flush()
        if len(self.data) > self.ROLL_BYTES:
            self.part += 1
            self.path, self.data = f"{self.base}.{self.part}", bytearray()


class _EventObjectFactory:
    """tensorboardX's writer factory for a URL scheme: event files through epath."""

    def open(self, path: str) -> _EventObjects:
        return _EventObjects(path)

    def directory_check(self, path: str) -> None:
        paths.makedirs(path)


# Modules tensorboardX imports when it can but bertjax never needs it to: torch (its writer names
# torch.Tensor in annotations), boto3 and google.cloud.storage (its own S3 and GCS event writers;
# bertjax registers its own writer for a URL logdir, through epath). Imported, they cost a
# launch 2.2 s, 0.3 s and 0.4 s on a machine that has them (this one; a TPU VM has the last).
TENSORBOARDX_SKIPS = ("torch", "boto3", "google.cloud.storage")


def _tensorboardx():
    """tensorboardX's SummaryWriter and register_writer_factory, imported with the modules of
    `TENSORBOARDX_SKIPS` that this process has not imported hidden (``import`` raises
    ImportError: tensorboardX's fallback); later imports of them are unaffected."""
    hidden = [name for name in TENSORBOARDX_SKIPS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        from tensorboardX import SummaryWriter
        from tensorboardX.record_writer import register_writer_factory
    finally:
        for name in hidden:
            del sys.modules[name]
    return SummaryWriter, register_writer_factory


class TensorBoard(Tracker):
    """Scalars, the run config and phase starts (as text) in TensorBoard event files in
    ``logdir`` (a URL too: event files through epath)."""

    def __init__(self, logdir: str, config: dict):
        SummaryWriter, register_writer_factory = _tensorboardx()
        if paths.is_url(logdir):
            register_writer_factory(logdir.split("://")[0], _EventObjectFactory())
        self._events = SummaryWriter(logdir, flush_secs=60)
        text = json.dumps(config, indent=1, sort_keys=True, default=str)
        self._events.add_text("config", "```\n" + text + "\n```", 0)

    def start(self, step: int, phase, phases: list) -> None:
        if len(phases) > 1:
            self._events.add_text("phase", f"{phase.name}: steps {phase.start}-{phase.end}", step)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self._events.add_scalar(tag, value, step)

    def flush(self) -> None:
        self._events.flush()

    def close(self) -> None:
        self._events.close()


class Jsonl(Tracker):
    """One JSON line of scalars per log or eval step in ``logdir/metrics.jsonl`` (a
    non-finite value as its string); a resumed run appends."""

    def __init__(self, logdir: str):
        path = paths.join(logdir, "metrics.jsonl")
        if paths.is_url(logdir):
            previous = paths.read_bytes(path) if paths.exists(path) else b""
            self._file = _ObjectFile(path, previous)
        else:
            self._file = open(path, "ab")

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        finite = {k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()}
        self._file.write((json.dumps({"step": step, **finite}) + "\n").encode())

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Trackers(Tracker):
    """Every configured tracker of a run (`open`), written by process 0 (``enabled``); a tracker
    that is off or another process's holds nothing and writes nothing."""

    def __init__(self, members: list[Tracker], record: run_record.RunRecord | None = None):
        self.members, self.record = members, record
        self.run_id = record.run_id if record else ""

    @classmethod
    def open(
        cls, config: ml_collections.ConfigDict, workdir: str, enabled: bool = True
    ) -> Trackers:
        if not enabled:
            return cls([])
        names = chosen(config)
        paths.makedirs(workdir)
        values = config.to_dict()
        record = run_record.open_record(workdir, values)
        members: list[Tracker] = []
        try:
            if "tensorboard" in names:
                members.append(TensorBoard(workdir, values))
            if "jsonl" in names:
                members.append(Jsonl(workdir))
            if "wandb" in names:
                from bertjax.training.wandb_tracker import WandbTracker

                members.append(WandbTracker(config, workdir, record.run_id))
        except BaseException:
            for member in members:
                member.close()
            raise
        return cls(members, record)

    def start(self, step: int, phase, phases: list) -> None:
        if self.record is not None:
            self.record.add_start(step, phase.name)
        for member in self.members:
            member.start(step, phase, phases)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        clean = {k: float(v) for k, v in scalars.items()}
        for member in self.members:
            member.write_scalars(step, clean)
        self.flush()

    def finish(self, summary: dict) -> None:
        for member in self.members:
            member.finish(summary)

    def fail(self, error: BaseException) -> None:
        for member in self.members:
            member.fail(error)

    def flush(self) -> None:
        for member in self.members:
            member.flush()

    def close(self) -> None:
        errors = []
        for member in self.members:
            try:
                member.close()
            except Exception as error:  # the others still close
                errors.append(error)
        self.members = []
        if errors:
            raise errors[0]
