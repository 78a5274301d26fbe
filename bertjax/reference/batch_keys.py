"""The batch each objective reads: keys, shapes (in the shape letters) and dtypes. An objective
fed by the pretraining pipeline gets the pipeline's layout (`bertjax.data.batch_spec`, the shapes
`make_pipeline(config, workdir).batch(step)` yields); the others (fine-tuning, embeddings) their
`Objective.example_batch`'s, the batch their contract test trains on."""

from __future__ import annotations

import numpy as np

ROWS, LENGTH, PREDICTIONS = 7, 64, 9  # stand-in sizes, read back as B, T and P
LETTERS = {ROWS: "B", LENGTH: "T", PREDICTIONS: "P", 2: "K"}
LEGEND = {
    "B": "rows of the batch (`config.batch_size`, this host's share of it)",
    "T": "row length (`config.data.max_seq_length`, or the length schedule's)",
    "P": "prediction slots a row (`config.data.max_predictions`)",
    "K": "documents a query: its positive and `config.pairs.num_negatives` hard negatives",
}
# What each key holds. A key an objective reads without a line here fails tests/reference_test.py.
MEANINGS = {
    "input_ids": "token ids, [CLS] first; masked or replaced tokens already substituted",
    "token_type_ids": "segment A (0) or B (1) of a sentence pair",
    "attention_mask": "1 at real tokens, 0 at padding",
    "segment_ids": "packed rows (`config.data.pack_rows`): 1, 2, ... a sample, 0 at padding; "
    "replaces attention_mask",
    "masked_positions": "where the predictions are (0: an empty slot)",
    "masked_ids": "the original token at each of masked_positions (the target)",
    "masked_weights": "1 at a real prediction, 0 at an empty slot",
    "next_sentence_label": "sentence-pair plans (nsp, sop): 0 B follows A, 1 random or swapped",
    "mask_ratio": "the row's masking rate t (diffusion; causal rows carry their input-mask rate)",
    "target_positions": "PERT: the position each selected token's original went to",
    "labels": "class id (a float for regression), per row or per token",
    "label_weights": "1 at an example (or a labelled first piece of a word), 0 at padding",
    "doc_input_ids": "each query's positive then its hard negatives, token ids",
    "doc_attention_mask": "1 at the documents' real tokens",
    "weights": "1 at a real query, 0 at a padding row of a held-out batch",
}


def _config(name: str):
    """A run config made ready for objective ``name``."""
    from bertjax.objectives.electra import add_electra_config
    from bertjax.objectives.finetune import add_finetune_config
    from bertjax.objectives.registry import with_objective
    from bertjax.training.run_config import default_run_config

    if name == "electra":
        return add_electra_config(default_run_config())
    if name in ("classification", "token_classification"):
        return add_finetune_config(default_run_config(), name, 3)
    return with_objective(default_run_config(), name)


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(LETTERS.get(d, str(d)) for d in shape) + "]"


def objective_batches() -> dict[str, list[tuple[str, str, str]]]:
    """{objective: [(key, shape, dtype), ...]} for every registered objective."""
    from bertjax.data.batch_spec import pipeline_batch_shapes
    from bertjax.modeling.bert_config import BertConfig
    from bertjax.objectives.registry import OBJECTIVES

    cfg = BertConfig.preset("tiny", vocab_size=100)
    out = {}
    for name, cls in OBJECTIVES.items():
        config = _config(name)
        example = cls.from_config(config).example_batch(cfg, ROWS, LENGTH, 0)
        shapes = {k: (v.shape, v.dtype) for k, v in example.items()}
        if cls.corruptions:
            data = config.data.copy_and_resolve_references()
            data.masking, data.max_predictions = cls.corruptions[0], PREDICTIONS
            piped = pipeline_batch_shapes(data, ROWS, LENGTH)
            shapes = {k: piped[k] for k in example if k in piped}
        out[name] = [(k, _shape(s), str(np.dtype(d))) for k, (s, d) in shapes.items()]
    return out


def markdown() -> str:
    """The batch reference page."""
    out = [
        "# Batch reference",
        "",
        "The keys, shapes and dtypes of the batch each objective reads (`config.loss.objective`),",
        "generated from the code: numpy arrays of fixed shapes, one global batch a step, of which",
        "each host holds its own rows. The pretraining objectives read the pipeline's batches",
        "(`bertjax.data.make_pipeline(config, workdir).batch(step)`); a batch of your own for",
        "`bertjax.step` has the same keys (see [the step API](../step-api.md)).",
        "",
        "| letter | size |",
        "|---|---|",
        *(f"| {letter} | {size} |" for letter, size in LEGEND.items()),
        "",
        "| key | holds |",
        "|---|---|",
        *(f"| `{key}` | {meaning} |" for key, meaning in MEANINGS.items()),
        "",
    ]
    for name, rows in objective_batches().items():
        out += [f"## `{name}`", "", "| key | shape | dtype |", "|---|---|---|"]
        out += [f"| `{key}` | {shape} | {dtype} |" for key, shape, dtype in rows]
        out.append("")
    return "\n".join(out)
