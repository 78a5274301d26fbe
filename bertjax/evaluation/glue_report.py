"""GLUE results from finished runs: the best learning rate of each task by the median score over
seeds, the task's metrics at that rate, the GLUE average, and the files that report them.

OUT/glue_results.json holds exactly ``{"cola": {"matthews": .., "score": ..}, ..., "average": ..}``
(fractions, task keys as in bertjax/tasks/glue_tasks.py; MNLI reports ``accuracy_m`` and
``accuracy_mm``); OUT/glue_runs.json every run and the median score of every learning rate;
OUT/glue_results.md a markdown table (x100, as papers print them).
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from bertjax.tasks.glue_tasks import GLUE_TASKS, TASKS

_NAMES = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}


def select(name: str, runs: list[dict]) -> dict:
    """The best learning rate of task ``name`` by the median score over its seeds (ties: the
    first rate in the grid); each official metric is the median over that rate's seeds and the
    task's score the mean of those medians."""
    rates = list(dict.fromkeys(run["learning_rate"] for run in runs))
    medians = {
        lr: float(np.median([r["score"] for r in runs if r["learning_rate"] == lr])) for lr in rates
    }
    best = max(rates, key=lambda lr: medians[lr])  # max keeps the first of equal medians
    chosen = [r for r in runs if r["learning_rate"] == best]
    metrics = {
        official: float(np.median([r["metrics"][official] for r in chosen]))
        for official, _ in TASKS[name].metrics
    }
    scores = [r["score"] for r in chosen]
    return {
        "learning_rate": best,
        "metrics": metrics,
        "score": float(np.mean(list(metrics.values()))),
        "seeds": [r["seed"] for r in chosen],
        "score_range": [float(min(scores)), float(max(scores))],
        "median_score_by_learning_rate": {f"{lr:g}": m for lr, m in medians.items()},
        "runs": runs,
    }


def glue_results(selected: dict[str, dict], final: bool = True) -> dict:
    """``{"cola": {"matthews": .., "score": ..}, ..., "average": ..}`` of the selected tasks; the
    average is over the eight GLUE tasks that ran (WNLI is reported, not averaged)."""
    results = {
        name: {**selected[name]["metrics"], "score": selected[name]["score"]}
        for name in [*GLUE_TASKS, "wnli"]
        if name in selected
    }
    averaged = [name for name in GLUE_TASKS if name in selected]
    missing = [name for name in GLUE_TASKS if name not in selected]
    if missing and final:
        logging.warning("GLUE average over %d tasks: %s did not run", len(averaged), missing)
    if averaged:
        results["average"] = float(np.mean([selected[name]["score"] for name in averaged]))
    return results


def markdown_table(selected: dict[str, dict], results: dict) -> str:
    """The results as a markdown table: metrics (median over seeds) and score x100, the best LR,
    the seeds and the range of the score over them."""
    lines = [
        "| task | metrics (median over seeds) | score | best LR | seeds | score range |",
        "|---|---|---|---|---|---|",
    ]
    for name in [*GLUE_TASKS, "wnli"]:
        if name not in selected:
            continue
        task = selected[name]
        metrics = " / ".join(f"{k} {100 * v:.1f}" for k, v in task["metrics"].items())
        low, high = task["score_range"]
        lines.append(
            f"| {_NAMES[name]} | {metrics} | {100 * task['score']:.1f} | "
            f"{task['learning_rate']:g} | {len(task['seeds'])} | {100 * low:.1f}-{100 * high:.1f} |"
        )
    if "average" in results:
        count = sum(name in selected for name in GLUE_TASKS)
        average = 100 * results["average"]
        lines.append(f"| **average** ({count} tasks) | | **{average:.1f}** | | | |")
    return "\n".join(lines) + "\n"


def _write_json(path: str, value) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def write_reports(
    workdir: str, selected: dict[str, dict], final: bool = True, data: str = ""
) -> dict:
    """Writes glue_results.json, glue_runs.json and glue_results.md into ``workdir`` (``final``
    False: partial results while tasks still run; ``data``: where the tasks came from, a line
    under the table)."""
    results = glue_results(selected, final)
    _write_json(os.path.join(workdir, "glue_results.json"), results)
    _write_json(os.path.join(workdir, "glue_runs.json"), selected)
    table = markdown_table(selected, results) + (f"\nData: {data}\n" if data else "")
    with open(os.path.join(workdir, "glue_results.md"), "w") as f:
        f.write(table)
    return results
