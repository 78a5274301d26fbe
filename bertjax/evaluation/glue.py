"""The GLUE harness behind ``python -m bertjax.glue``: one fine-tuning run per (task, learning
rate, seed) through the trainer, then the best rate per task by the median over seeds.

What a run reports (``config.glue.report``): "last" (the default), the dev metrics of one
evaluation at the end of training, as ELECTRA's run_finetuning.py evaluates each trial and as
published GLUE dev numbers are medians of; "best_on_dev", the best of
``evals_per_epoch`` evaluations an epoch, an early-stopping choice made on the same dev set it
reports (higher than the end-of-training number, so not comparable with published dev scores).
The learning rate is chosen on the dev medians either way (BERT's and ELECTRA's practice).

Each run is an ordinary fine-tuning run (``config.loss.objective="classification"``, task data
from ``glue:NAME``: the Hub's ``nyu-mll/glue`` parquet by default, or a GLUE directory; or from
TFDS ``glue/NAME``) in OUT/runs/TASK/lrLR_seedS. From the Hub, every task's files are downloaded
(or found in the Hugging Face cache) before the first run, and the revision is resolved to its
commit SHA, which each run's config carries (a branch that moves later is not mixed in).
When it ends, its dev metrics go to result.json there, and a later call skips it (a run stopped
half-way resumes from its own checkpoints); a result.json written under other settings stops
the harness rather than being mixed in. ``config.glue.from_mnli`` tasks start from the encoder of
the best MNLI run (RoBERTa's recipe for RTE, MRPC and STS-B), so MNLI runs first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil

import ml_collections
from ml_collections import config_dict

from bertjax import paths
from bertjax.evaluation import glue_report
from bertjax.tasks import glue_hub, glue_tasks, tasks
from bertjax.training.run_config import resolve_paths
from bertjax.training.trainer import train_and_evaluate

# Per-task keys; a task's own value (config.glue.TASK.KEY) replaces config.glue.KEY when set.
TASK_KEYS = {
    "learning_rates": tuple,
    "seeds": tuple,
    "epochs": float,
    "batch_size": int,
    "warmup_fraction": float,
    "layerwise_lr_decay": float,
}
REPORTS = ("last", "best_on_dev")
# Where the tasks come from: the Hub's nyu-mll/glue parquet, a GLUE directory, prepared TFDS.
SOURCES = ("hub", "dir", "tfds")


def default_glue_config() -> ml_collections.ConfigDict:
    """``config.glue``: which tasks run, and each task's hyper-parameters (BERT's recipe)."""
    c = ml_collections.ConfigDict()
    c.tasks = glue_tasks.GLUE_TASKS  # tasks to run, in order (add "wnli": reported, not averaged)
    c.learning_rates = (2e-5, 3e-5, 4e-5, 5e-5)  # peak LR grid; best by median score over seeds
    c.seeds = (0, 1, 2)  # one run per seed (classifier init, data order, dropout)
    c.epochs = 3.0  # passes over the train split (steps = ceil(epochs * examples / batch))
    c.batch_size = 32  # global batch size
    c.warmup_fraction = 0.1  # linear warmup as a fraction of the run's steps
    c.layerwise_lr_decay = 1.0  # LLRD factor per layer (1.0: off, as BERT)
    c.evals_per_epoch = 1  # report "best_on_dev": dev evaluations per epoch (and after the last)
    # "last": dev metrics of one evaluation at the end of each run (ELECTRA's, what published dev
    # numbers are); "best_on_dev": the best of the run's evaluations (early stopping on dev)
    c.report = "last"
    c.from_mnli = ()  # tasks fine-tuned from the best MNLI run (RoBERTa: ("rte", "mrpc", "stsb"))
    c.keep_checkpoints = False  # False: delete each run's checkpoints once its result is written
    for name in glue_tasks.TASKS:  # per-task values; None: the shared value above
        c[name] = ml_collections.ConfigDict(
            {key: config_dict.placeholder(kind) for key, kind in TASK_KEYS.items()}
        )
    return c


def validate_glue_config(glue: ml_collections.ConfigDict) -> None:
    """Stops with one message naming the first bad ``config.glue`` key."""
    unknown = [name for name in glue.tasks if name not in glue_tasks.TASKS]
    if unknown or not glue.tasks:
        raise ValueError(
            f"config.glue.tasks={tuple(glue.tasks)}: unknown {unknown}; GLUE tasks are "
            f"{tuple(glue_tasks.TASKS)}"
        )
    if glue.report not in REPORTS:
        raise ValueError(f"config.glue.report={glue.report!r}: must be one of {REPORTS}")
    bad = [name for name in glue.from_mnli if name not in glue_tasks.TASKS or name == "mnli"]
    if bad:
        raise ValueError(
            f"config.glue.from_mnli={tuple(glue.from_mnli)}: {bad} cannot start from MNLI"
        )
    if set(glue.from_mnli) & set(glue.tasks) and "mnli" not in glue.tasks:
        raise ValueError(
            f"config.glue.from_mnli={tuple(glue.from_mnli)} needs 'mnli' in config.glue.tasks"
        )
    if int(glue.evals_per_epoch) < 1:
        raise ValueError(f"config.glue.evals_per_epoch={glue.evals_per_epoch}: must be >= 1")
    for name in glue.tasks:
        hp = task_hparams(glue, name)
        if not hp["learning_rates"] or not hp["seeds"]:
            raise ValueError(f"config.glue.{name}: learning_rates and seeds must be non-empty")
        if hp["epochs"] <= 0 or hp["batch_size"] <= 0:
            raise ValueError(f"config.glue.{name}: epochs and batch_size must be positive")


def task_hparams(glue: ml_collections.ConfigDict, name: str) -> dict:
    """Task ``name``'s hyper-parameters: its own values where set, else the shared ones."""
    own = glue[name]
    return {key: glue[key] if own[key] is None else own[key] for key in TASK_KEYS}


def _run_config(config, name: str, source: dict, hp: dict, lr: float, seed: int, init_from):
    """The fine-tuning run config of one (task, learning rate, seed); steps set by the caller.
    ``source``: {"kind": one of SOURCES, "glue_dir": ..., "revision": the Hub commit SHA}."""
    values = config.to_dict()
    values.pop("glue")
    run = ml_collections.ConfigDict(values)
    task = glue_tasks.TASKS[name]
    tfds = source["kind"] == "tfds"
    run.task.source = f"tfds:glue/{name}" if tfds else f"glue:{name}"
    run.task.glue_dir = source["glue_dir"]
    if source["kind"] == "hub":
        run.task.glue_revision = source["revision"]
    run.task.labels = () if tfds else task.labels  # TFDS labels are already ids
    run.task.metric = ""  # the task's GLUE score
    run.loss.objective = "classification"
    run.loss.num_labels = len(task.labels) or 1
    run.init_from = init_from
    run.seed = int(seed)
    run.batch_size = int(hp["batch_size"])
    run.optim.learning_rate = float(lr)
    run.optim.warmup_fraction = float(hp["warmup_fraction"])
    run.optim.warmup_steps = 0
    run.optim.layerwise_lr_decay = float(hp["layerwise_lr_decay"])
    return run


def _fingerprint(run: ml_collections.ConfigDict, report: str) -> str:
    """A hash of what decides a run's result (its config, less the progress bar; the report)."""
    values = {k: v for k, v in run.to_dict().items() if k != "progress_bar"}
    text = json.dumps([values, report], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class GlueHarness:
    """The runs of ``config.glue`` into ``workdir``, their tasks from ``source`` (one of
    SOURCES; "": "dir" when ``glue_dir`` is given, else "hub")."""

    def __init__(
        self, config: ml_collections.ConfigDict, glue_dir: str, workdir: str, source: str = ""
    ):
        validate_glue_config(config.glue)
        # Every path resolved here, once (config.init_from, task files, caches; relative to the
        # current directory, ~ expanded): a missing one stops before the first of many runs.
        config = resolve_paths(config)
        glue_dir = paths.resolve(glue_dir, "--glue_dir")
        source = source or ("dir" if glue_dir else "hub")
        if source not in SOURCES:
            raise ValueError(f"--glue_source={source!r}: one of {SOURCES}")
        if source == "dir" and not glue_dir:
            raise ValueError("--glue_source=dir needs --glue_dir=DIR (the GLUE download script's)")
        if source != "dir" and glue_dir:
            raise ValueError(
                f"--glue_dir={glue_dir!r} reads a GLUE directory: not with --glue_source={source}"
            )
        if glue_dir and not paths.isdir(glue_dir):
            raise paths.MissingPathError(
                f"--glue_dir={glue_dir!r} is not a directory (the GLUE download script's "
                "folder: CoLA/, SST-2/, ...)"
            )
        self.config, self.glue_dir = config, glue_dir
        self.source = {"kind": source, "glue_dir": glue_dir, "revision": ""}
        self.data = (
            f"TFDS glue/* ({config.task.tfds_data_dir or 'tfds default'})"
            if source == "tfds"
            else glue_dir
        )
        if source == "hub":  # every task's files now (or from the cache), before the first run
            repo, revision = config.task.glue_repo, config.task.glue_revision
            _, sha = glue_hub.download(config.glue.tasks, repo, revision)
            self.source["revision"] = sha
            self.data = f"hf://datasets/{repo}@{sha}"
        logging.info("GLUE tasks from %s", self.data)
        self.workdir = paths.resolve(workdir, "--workdir")
        self._train_sizes: dict[str, int] = {}

    def order(self) -> list[str]:
        """config.glue.tasks, MNLI first when another task starts from it."""
        names = list(self.config.glue.tasks)
        if set(self.config.glue.from_mnli) & set(names):
            names.remove("mnli")
            names.insert(0, "mnli")
        return names

    def _train_size(self, run) -> int:
        name = run.task.source.split(":")[-1].split("/")[-1]
        if name not in self._train_sizes:
            n = len(tasks.load_examples(run.task, "train", tokens=False))
            subset = int(run.task.train_examples)
            self._train_sizes[name] = min(n, subset) if subset > 0 else n
        return self._train_sizes[name]

    def run_one(self, name: str, lr: float, seed: int, init_from: str) -> dict:
        """One fine-tuning run's result (read from its result.json when it already finished)."""
        hp = task_hparams(self.config.glue, name)
        run = _run_config(self.config, name, self.source, hp, lr, seed, init_from)
        steps_per_epoch = max(1, math.ceil(self._train_size(run) / run.batch_size))
        run.num_train_steps = run.optim.total_steps = max(
            1, math.ceil(float(hp["epochs"]) * steps_per_epoch)
        )
        if self.config.glue.report == "last":  # one evaluation, after the last step
            run.eval_every = run.num_train_steps
        else:
            run.eval_every = max(1, steps_per_epoch // int(self.config.glue.evals_per_epoch))
        directory = os.path.join(self.workdir, "runs", name, f"lr{lr:g}_seed{seed}")
        path = os.path.join(directory, "result.json")
        fingerprint = _fingerprint(run, self.config.glue.report)
        if os.path.isfile(path):
            with open(path) as f:
                result = json.load(f)
            if result["fingerprint"] != fingerprint:
                raise ValueError(
                    f"{path} was written by a run with other settings; use another --workdir "
                    "or delete that run's directory to rerun it"
                )
            logging.info("%s lr=%g seed=%d: done earlier (%s)", name, lr, seed, path)
            return result
        summary = train_and_evaluate(run, directory)
        if self.config.glue.report == "best_on_dev":
            with open(os.path.join(directory, "best", "best.json")) as f:
                best = json.load(f)
            metrics, step = best["metrics"], best["step"]
        else:
            metrics, step = summary, summary["step"]
        official = glue_tasks.official_metrics(name, metrics)
        result = {
            "task": name,
            "learning_rate": float(lr),
            "seed": int(seed),
            "metrics": official,
            "score": glue_tasks.task_score(name, metrics),
            "step": int(step),
            "steps": int(run.num_train_steps),
            "init_from": init_from,
            "fingerprint": fingerprint,
        }
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)
        if not self.config.glue.keep_checkpoints:
            shutil.rmtree(os.path.join(directory, "checkpoints"), ignore_errors=True)
            if name != "mnli" or not self.config.glue.from_mnli:  # MNLI's best seeds others
                shutil.rmtree(os.path.join(directory, "best"), ignore_errors=True)
        line = " ".join(f"{k}={v:.4f}" for k, v in official.items())
        print(f"GLUE {name} lr={lr:g} seed={seed}: {line} score={result['score']:.4f}", flush=True)
        return result

    def run_task(self, name: str, init_from: str) -> dict:
        """Every (learning rate, seed) run of a task, and the selection over them."""
        hp = task_hparams(self.config.glue, name)
        runs = [
            self.run_one(name, float(lr), int(seed), init_from)
            for lr in hp["learning_rates"]
            for seed in hp["seeds"]
        ]
        return glue_report.select(name, runs)

    def mnli_checkpoint(self, mnli: dict) -> str:
        """The kept checkpoint (WORKDIR/best: under report "last" the end of training, its only
        evaluation) of the highest-scoring MNLI run at MNLI's best learning rate."""
        chosen = [r for r in mnli["runs"] if r["learning_rate"] == mnli["learning_rate"]]
        top = max(chosen, key=lambda r: r["score"])
        path = os.path.join(
            self.workdir, "runs", "mnli", f"lr{top['learning_rate']:g}_seed{top['seed']}", "best"
        )
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"config.glue.from_mnli needs the MNLI checkpoint {path}, which was deleted; "
                "rerun MNLI (delete OUT/runs/mnli) or set config.glue.keep_checkpoints=True"
            )
        return path

    def run(self) -> dict:
        """Runs (or reads) every task and writes OUT/glue_results.json, glue_runs.json and
        glue_results.md; returns the results dict."""
        os.makedirs(self.workdir, exist_ok=True)
        selected = {}
        for name in self.order():
            init_from = self.config.init_from
            if name in self.config.glue.from_mnli:
                init_from = self.mnli_checkpoint(selected["mnli"])
            selected[name] = self.run_task(name, init_from)
            glue_report.write_reports(self.workdir, selected, final=False, data=self.data)
        return glue_report.write_reports(self.workdir, selected, data=self.data)


def run_glue(
    config: ml_collections.ConfigDict, glue_dir: str, workdir: str, source: str = ""
) -> dict:
    """Runs GLUE as ``config.glue`` says, its tasks from ``source`` (`GlueHarness`: by default
    ``glue_dir`` when given, else the Hub's nyu-mll/glue); returns OUT/glue_results.json's
    contents."""
    return GlueHarness(config, glue_dir, workdir, source).run()
