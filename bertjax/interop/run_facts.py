"""What a bertjax run did, read back from its workdir for a model card (`bertjax.interop.
model_card`): steps, rows and tokens trained, training data (a Hub dataset with its revision),
hardware, the run id, and the evaluation of the exported checkpoint.

Everything comes from what the run left: the checkpoint's step and run config, WORKDIR/run.json
(`bertjax.training.run_record`: id, hardware, the whole run config with its phases), metrics.jsonl
or best/best.json (evaluation).
Rows and tokens are recomputed from the run config, since a run's batches are a function of its
config and step: the rows of every step (batch warmup and phases included) times their row
length (a length schedule's), the count the phases' ``tokens`` use.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import ml_collections

from bertjax import paths
from bertjax.training import run_record

# hf://datasets/OWNER/NAME[@REVISION][/PATTERN] (the form config.data.corpus takes for the Hub)
_HUB = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<revision>[^/]+))?(?:/.*)?$")
GLUE = "nyu-mll/glue"  # GLUE's dataset on the Hub, the same tasks as the download script's


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset a run trained or evaluated on: a Hub id (with config and revision) when it has
    one, else only its description."""

    description: str
    hub_id: str = ""
    config: str = ""
    revision: str = ""


@dataclasses.dataclass
class RunFacts:
    """The facts a model card states about a run (module docstring)."""

    objective: str
    step: int
    rows: int | None  # None: not known (a run config without the batch keys)
    tokens: int | None
    max_seq_length: int
    batch_size: int
    datasets: list[Dataset]
    hardware: list[str]
    run_id: str
    init_from: str
    evaluation: dict[str, float]
    evaluation_step: int | None
    evaluation_data: Dataset | None


def workdir_of(path: str) -> str:
    """The run's workdir for a path `loading.load` read (its best/ or checkpoints/ dir)."""
    path = path.rstrip("/")
    if os.path.basename(path) in ("best", "checkpoints"):
        return os.path.dirname(path)
    return path


def _config(run: dict) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(run)


def trained_rows_and_tokens(run: dict, step: int) -> tuple[int, int]:
    """Rows and tokens (rows x row length) the first ``step`` steps of the run trained on."""
    from bertjax.data.plans.batch_plan import BatchPlan
    from bertjax.data.plans.schedule import LengthSchedule
    from bertjax.training.phases import plan_phases

    rows = tokens = 0
    for phase in plan_phases(_config(run)):
        steps = max(0, min(step, phase.end) - phase.start)
        if not steps:
            continue
        c = phase.config
        length = int(c.data.max_seq_length) if "data" in c else 0
        plan = BatchPlan.from_config(c, length)
        phase_rows = plan.samples_before(steps)
        rows += phase_rows
        schedule = tuple(c.data.get("length_schedule", ())) if "data" in c else ()
        if not schedule:
            tokens += phase_rows * length
            continue
        lengths = LengthSchedule(
            length, schedule, bool(c.data.mixed_lengths), int(c.num_train_steps), int(c.seed)
        )
        tokens += sum(plan.batch(k) * lengths(k)[0] for k in range(steps))
    return rows, tokens


def _corpus_dataset(entry: str) -> Dataset:
    match = _HUB.match(entry)
    if match:
        revision = match["revision"] or "main"
        return Dataset(entry, match["repo"], "", revision)
    if entry == "builtin":
        return Dataset("bertjax's built-in corpus (CPython's documentation and docstrings)")
    if entry.startswith("tfds:"):
        return Dataset(f"TFDS {entry[5:]}")
    return Dataset(f"local files {entry}")


def _task_dataset(task: dict) -> Dataset:
    source = task.get("source", "")
    glue = re.match(r"^(?:glue:|tfds:glue/)(?P<name>\w+)", source)
    if glue and source.startswith("glue:") and not task.get("glue_dir"):  # the Hub's parquet
        repo, revision = task.get("glue_repo") or GLUE, task.get("glue_revision", "")
        return Dataset(f"GLUE {glue['name']}", repo, glue["name"], revision)
    if glue:  # the download script's folder or TFDS: the same tasks, no Hub revision
        return Dataset(f"GLUE {glue['name']}", GLUE, glue["name"])
    match = _HUB.match(source)
    if match:
        return Dataset(source, match["repo"], "", match["revision"] or "main")
    if source.startswith("builtin:"):
        return Dataset(f"bertjax's built-in task {source[8:]} (CPython's docstrings)")
    if source == "files":
        return Dataset(f"local files {task.get('train_file', '')}")
    return Dataset(source)


def training_datasets(run: dict) -> list[Dataset]:
    """The data the run trained on: a fine-tuning task's, an embedding run's pairs, else the
    pretraining corpus (each comma-separated entry, each store of a mixture)."""
    if "task" in run:
        return [_task_dataset(run["task"])]
    if "pairs" in run:
        source = run["pairs"].get("source", "builtin")
        if source == "builtin":
            return [Dataset("bertjax's built-in query-passage pairs (CPython's documentation)")]
        return [_corpus_dataset(source)]
    data = run.get("data", {})
    entries = [e.strip() for e in str(data.get("corpus", "builtin")).split(",") if e.strip()]
    datasets = [_corpus_dataset(e) for e in entries]
    datasets += [_corpus_dataset(str(url)) for url, _ in data.get("mixture", ())]
    if data.get("store") and not data.get("mixture"):
        datasets = [Dataset(f"a prepared store {data['store']}", "", "", "")] + datasets
    return datasets


def hardware(record: run_record.RunRecord | None) -> tuple[str, list[str]]:
    """(run id, each distinct hardware the run's starts ran on, as 'N x KIND (P processes)')."""
    if record is None:
        return "", []
    seen = []
    for start in record.starts:
        processes = start.get("processes", 1)
        line = f"{start.get('devices')} x {start.get('device_kind')} ({processes} process"
        line += "es)" if processes != 1 else ")"
        if line not in seen:
            seen.append(line)
    return record.run_id, seen


def evaluation(workdir: str, checkpoint: str, step: int) -> tuple[dict[str, float], int | None]:
    """The held-out metrics of the exported checkpoint and the step they were measured at: a
    best/ checkpoint's best.json, else the last evaluation in metrics.jsonl at or before
    ``step`` (an earlier one when the run did not evaluate at that step)."""
    best = paths.join(checkpoint, "best.json")
    if os.path.basename(checkpoint.rstrip("/")) == "best" and paths.isfile(best):
        record = json.loads(paths.read_text(best))
        metrics = {k.removeprefix("eval/"): float(v) for k, v in record["metrics"].items()}
        return _finite(metrics), int(record["step"])
    jsonl = paths.join(workdir, "metrics.jsonl")
    if not paths.isfile(jsonl):
        return {}, None
    found, at = {}, None
    for line in paths.read_text(jsonl).splitlines():
        row = json.loads(line) if line.strip() else {}
        evals = {k[5:]: v for k, v in row.items() if k.startswith("eval/")}
        if evals and row.get("step", math.inf) <= step:
            found, at = evals, int(row["step"])
    return _finite(found), at


def _finite(metrics: dict) -> dict[str, float]:
    return {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
    }


def gather(model, workdir: str) -> RunFacts:
    """The facts of the run behind ``model`` (a `bertjax.inference.loading.TrainedModel` read
    from a bertjax workdir) in ``workdir``."""
    run = model.run
    record = run_record.read_record(workdir)
    whole = record.values.get("config") if record is not None else None  # with its phases
    try:
        rows, tokens = trained_rows_and_tokens(whole or run, model.step)
    except (KeyError, AttributeError, TypeError):  # a config without the batch keys: unknown
        rows = tokens = None
    run_id, machines = hardware(record)
    metrics, at = evaluation(workdir, model.path, model.step)
    datasets = training_datasets(run)
    held_out = None
    if metrics:
        held_out = datasets[0] if datasets else Dataset("held-out data")
    return RunFacts(
        objective=run.get("loss", {}).get("objective", "pretraining"),
        step=model.step,
        rows=rows,
        tokens=tokens,
        max_seq_length=int(run.get("data", {}).get("max_seq_length", model.max_seq_length)),
        batch_size=int(run.get("batch_size", 0)),
        datasets=datasets,
        hardware=machines,
        run_id=run_id,
        init_from=str(run.get("init_from", "") or ""),
        evaluation=metrics,
        evaluation_step=at,
        evaluation_data=held_out,
    )
