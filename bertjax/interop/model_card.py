"""The model card (README.md) of an exported model: YAML metadata the Hub reads, then the run's
facts in prose and tables.

The metadata is made by huggingface_hub's own `ModelCardData` (``pip install 'bertjax[hub]'``):
``library_name``, ``license``, ``datasets`` (Hub ids), ``pipeline_tag``, ``tags``, ``base_model``
when given, the evaluation in the Hub's ``model-index`` form (task, dataset with its config,
split and revision, one metric a row), and a ``bertjax`` block with what the Hub has no key for:
the run id, objective, steps, rows and tokens, row length, batch size, the training data with
their revisions, and the hardware. `bertjax.interop.run_facts` gathers the facts.
"""

from __future__ import annotations

from bertjax.interop.run_facts import RunFacts

# What a model predicts (bertjax.inference.loading TASKS) -> the Hub's pipeline tag and the
# model-index task type, and a line for the card.
TASKS = {
    "fill_mask": ("fill-mask", "Masked language modeling", "a masked language model"),
    "classify": ("text-classification", "Text classification", "a text classifier"),
    "tag": ("token-classification", "Token classification", "a token classifier (tagger)"),
    "embed": ("sentence-similarity", "Sentence similarity", "a sentence embedding model"),
}


def _require_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ValueError(
            "writing a model card needs huggingface_hub: pip install 'bertjax[hub]'"
        ) from None
    return huggingface_hub


def metadata(facts: RunFacts, *, name: str, task: str, library: str, family: str, **given):
    """The card's `ModelCardData`; ``given``: license, base_model."""
    hub = _require_hub()
    pipeline_tag, task_name, _ = TASKS[task]
    data = facts.evaluation_data
    results = [
        hub.EvalResult(
            task_type=pipeline_tag,
            task_name=task_name,
            dataset_type=data.hub_id or "bertjax-held-out",
            dataset_name=data.description,
            dataset_config=data.config or None,
            dataset_split="validation" if facts.objective in _FINE_TUNING else "held-out",
            dataset_revision=data.revision or None,
            metric_type=metric,
            metric_value=value,
            metric_name=f"{metric} (step {facts.evaluation_step})",
        )
        for metric, value in sorted(facts.evaluation.items())
    ]
    training = {
        "run_id": facts.run_id or None,
        "objective": facts.objective,
        "steps": facts.step,
        "rows": facts.rows,  # None (unknown) is left out below
        "tokens": facts.tokens,
        "max_seq_length": facts.max_seq_length,
        "batch_size": facts.batch_size,
        "training_data": [{k: v for k, v in vars(d).items() if v} for d in facts.datasets],
        "hardware": facts.hardware,
    }
    if facts.init_from:
        training["init_from"] = facts.init_from
    training = {k: v for k, v in training.items() if v is not None}
    datasets = sorted({d.hub_id for d in facts.datasets if d.hub_id})
    return hub.ModelCardData(
        model_name=name,
        library_name=library,
        license=given.get("license") or None,
        base_model=given.get("base_model") or None,
        datasets=datasets or None,
        pipeline_tag=pipeline_tag,
        tags=["bertjax", "jax", family, pipeline_tag],
        eval_results=results or None,
        bertjax=training,
    )


_FINE_TUNING = ("classification", "token_classification", "embedding")


def _number(n: int) -> str:
    return f"{n:,}"


def body(facts: RunFacts, *, name: str, task: str, architecture: str, parameters: int) -> str:
    """The card's Markdown below the metadata."""
    _, _, what = TASKS[task]
    lines = [
        f"# {name}",
        "",
        f"{what.capitalize()} ({architecture}, {_number(parameters)} parameters), trained with "
        "bertjax (JAX/Flax) and exported to PyTorch safetensors.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| Objective | {facts.objective} |",
        f"| Steps | {_number(facts.step)} |",
    ]
    if facts.rows is not None:
        lines += [
            f"| Rows | {_number(facts.rows)} (batch size {facts.batch_size}) |",
            f"| Tokens | {_number(facts.tokens)} (rows x row length, rows up to "
            f"{facts.max_seq_length} tokens) |",
        ]
    for dataset in facts.datasets:
        where = dataset.description
        if dataset.hub_id:
            where = f"[{dataset.hub_id}](https://huggingface.co/datasets/{dataset.hub_id})"
            where += f" config {dataset.config}" if dataset.config else ""
            where += f" at revision `{dataset.revision}`" if dataset.revision else ""
        lines.append(f"| Training data | {where} |")
    for machine in facts.hardware or ["not recorded (a run from before WORKDIR/run.json)"]:
        lines.append(f"| Hardware | {machine} |")
    if facts.init_from:
        lines.append(f"| Started from | `{facts.init_from}` |")
    if facts.run_id:
        lines.append(f"| bertjax run id | `{facts.run_id}` |")
    lines += ["", "## Evaluation", ""]
    if facts.evaluation:
        split = "validation" if facts.objective in _FINE_TUNING else "held-out"
        lines += [
            f"On the {split} split of {facts.evaluation_data.description}, "
            f"at step {facts.evaluation_step}:",
            "",
            "| metric | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.4g} |" for k, v in sorted(facts.evaluation.items())]
    else:
        lines.append("The run recorded no evaluation.")
    lines += ["", "## Use", "", "```python", *_usage(task, name), "```", ""]
    return "\n".join(lines)


def _usage(task: str, name: str) -> list[str]:
    if task == "embed":
        return [
            "from sentence_transformers import SentenceTransformer",
            "",
            f'model = SentenceTransformer("{name}")',
            'vectors = model.encode(["a sentence", "another one"])',
        ]
    auto = {
        "fill_mask": "AutoModelForMaskedLM",
        "classify": "AutoModelForSequenceClassification",
        "tag": "AutoModelForTokenClassification",
    }[task]
    return [
        f"from transformers import AutoTokenizer, {auto}",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
        f'model = {auto}.from_pretrained("{name}")',
        'outputs = model(**tokenizer(["a sentence"], return_tensors="pt"))',
    ]


def model_card(
    facts: RunFacts,
    *,
    name: str,
    task: str,
    family: str,
    architecture: str,
    parameters: int,
    license: str = "",
    base_model: str = "",
) -> str:
    """The README.md text: ``---`` YAML metadata ``---``, then the body."""
    library = "sentence-transformers" if task == "embed" else "transformers"
    data = metadata(
        facts,
        name=name,
        task=task,
        library=library,
        family=family,
        license=license,
        base_model=base_model,
    )
    text = body(facts, name=name, task=task, architecture=architecture, parameters=parameters)
    return f"---\n{data.to_yaml()}\n---\n\n{text}"
