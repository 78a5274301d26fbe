"""The shapes and dtypes of the pretraining pipeline's batches, without a corpus: what
`bertjax.data.pipeline` yields for ``rows`` rows of ``length`` tokens (its `mask_rows`), for
compiling a step ahead of time (`python -m bertjax.compile`). tests/data_pipeline_test.py checks it
against real batches."""

from __future__ import annotations

import numpy as np


def pipeline_batch_shapes(c, rows: int, length: int, held_out: bool = False) -> dict:
    """{key: (shape, dtype)} of a pipeline batch under ``config.data`` ``c``; ``held_out``: an
    eval batch (masked width ``eval_max_predictions`` when set)."""
    if c.masking == "causal":  # every position predicts the next token
        width = length
    elif c.masking == "diffusion":  # all positions are listed (bertjax/data/corruption/masking.py)
        width = length
    else:
        width = int((held_out and c.eval_max_predictions) or c.max_predictions)
    row, masked = (rows, length), (rows, width)
    shapes = {
        "input_ids": (row, np.int32),
        "token_type_ids": (row, np.int32),
        "attention_mask": (row, np.int32),
    }
    if c.pack_rows:
        shapes["segment_ids"] = (row, np.int32)
    target = "target_positions" if c.masking == "pert" else "masked_ids"
    shapes.update(
        {
            "masked_positions": (masked, np.int32),
            target: (masked, np.int32),
            "masked_weights": (masked, np.float32),
            "next_sentence_label": ((rows,), np.int32),
            "mask_ratio": ((rows,), np.float32),
        }
    )
    return shapes
