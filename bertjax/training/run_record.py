"""WORKDIR/run.json: the run's id, its config and where each start of it ran (process 0).

The id is made once, when a workdir first trains, and kept: a restarted or resumed run (and each
phase) keeps it, so W&B continues the same run under it (`bertjax.training.wandb_tracker`), and
the model card names it (`bertjax.interop.model_card`). Each start writes its whole run config
(a multi-phase run's phases too, which no checkpoint holds) and adds the step it began at and the
hardware (platform, device kind and count, processes), which the card reports:

    {"run_id": "3f9c0a1b2c4d", "config": {...},
     "starts": [{"step": 0, "phase": "run", "time": "2026-12-06T08:00:00Z", "platform": "tpu",
                 "device_kind": "TPU v5 lite", "devices": 16, "processes": 4}]}
"""

from __future__ import annotations

import json
import secrets
import time

from bertjax import paths

RUN_FILE = "run.json"


class RunRecord:
    """A workdir's run.json, read or made (`open_record`)."""

    def __init__(self, path: str, values: dict):
        self.path, self.values = path, values

    @property
    def run_id(self) -> str:
        return self.values["run_id"]

    @property
    def starts(self) -> list[dict]:
        return self.values.setdefault("starts", [])

    def add_start(self, step: int, phase: str) -> None:
        """Records that the run (re)started at ``step`` in ``phase`` on this hardware."""
        moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.starts.append({"step": int(step), "phase": phase, "time": moment, **hardware()})
        self.write()

    def write(self) -> None:
        text = json.dumps(self.values, indent=1, default=str)
        paths.write_text(self.path, text + "\n")


def hardware() -> dict:
    """What this run's processes run on: platform, device kind and count, processes."""
    import jax

    devices = jax.devices()
    return {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "processes": jax.process_count(),
    }


def read_record(workdir: str) -> RunRecord | None:
    """The workdir's run record, or None when it has none (a run from before run.json existed);
    a file that is not a run record stops with one line naming it."""
    path = paths.join(workdir, RUN_FILE)
    if not paths.isfile(path):
        return None
    try:
        values = json.loads(paths.read_text(path))
        if not isinstance(values, dict) or not isinstance(values.get("run_id"), str):
            raise ValueError("no run_id")
    except ValueError as error:
        raise ValueError(
            f"{path} is not a bertjax run record ({error}): move it aside to start a new run id"
        ) from None
    return RunRecord(path, values)


def open_record(workdir: str, config: dict | None = None) -> RunRecord:
    """The workdir's run record, holding ``config`` (the whole run config of this start: a
    checkpoint keeps only its phase's); a workdir without one gets a new run id."""
    record = read_record(workdir)
    if record is None:
        record = RunRecord(paths.join(workdir, RUN_FILE), {"run_id": secrets.token_hex(6)})
    if config is not None:
        record.values["config"] = config
    record.write()
    return record
