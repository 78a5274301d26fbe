"""The label names a classifier or tagger predicts, in label id order: a Hugging Face directory's
``id2label``, a fine-tuning run's ``config.task.labels``, else the sorted labels of the run's
training examples, read again with the task's own readers (`--labels` when they are gone)."""

from __future__ import annotations

import ml_collections

from bertjax.inference.loading import TrainedModel
from bertjax.tasks import tasks


def label_names(model: TrainedModel, task: str) -> list[str]:
    """``model``'s label names for ``task`` ("classify" or "tag"); [] for a regression."""
    if model.form == "workdir":
        loss = model.run.get("loss", {})
        return run_labels(model.run, task == "tag", int(loss.get("num_labels", 2)))
    return hf_labels(model.hf_config)


def hf_labels(config: dict) -> list[str]:
    """An HF config.json's ``id2label`` values in id order ([] for a regression)."""
    id2label = config.get("id2label") or {}
    if config.get("problem_type") == "regression" or config.get("num_labels", len(id2label)) == 1:
        return []
    return [str(id2label[k]) for k in sorted(id2label, key=int)]


def run_labels(run: dict, tokens: bool, num_labels: int) -> list[str]:
    """The label names a fine-tuning run trained with: its config.task.labels, else the sorted
    labels of its training examples (read again with the task's own readers)."""
    if "task" not in run:
        raise ValueError("the model has no fine-tuning task in its run config: pass --labels")
    task = ml_collections.ConfigDict(run["task"])
    if num_labels == 1 and not tokens:
        return []
    if task.labels:
        return [str(v) for v in task.labels]
    try:
        train = tasks.load_examples(task, "train", tokens)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"the run's label names come from its training data ({task.source}), which cannot be "
            f"read here ({e}): pass --labels=NAME,NAME,... in label id order"
        ) from None
    return tasks.label_index(train, task.labels, num_labels, tokens)
