"""The shapes and verdicts the compile check (`bertjax.aot.plan`) and the fit search
(`bertjax.aot.fit`, `bertjax.aot.estimate`) share: a phase's abstract batch, the same with a
sharding, and the compiler's refusal for want of memory."""

from __future__ import annotations

import re

import jax

from bertjax.data.batch_spec import pipeline_batch_shapes


def abstract_batch(config, objective, model_cfg, rows: int, held_out: bool) -> dict:
    length = int(config.data.max_seq_length)
    if objective.corruptions is not None:  # a pretraining corruption: the pipeline's batch
        shapes = pipeline_batch_shapes(config.data, rows, length, held_out)
    else:
        example = objective.example_batch(model_cfg, 2, length, 0)
        shapes = {k: ((rows, *v.shape[1:]), v.dtype) for k, v in example.items()}
    return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}


def with_sharding(tree: dict, sharding_) -> dict:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding_), tree)


AMOUNT = re.compile(r"\(?([\d.]+)([KMGT])(?:i?B)?\b\)?")
SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def out_of_memory(error: Exception) -> str:
    """The compiler's one-line refusal for want of memory ("" for another error)."""
    message = str(error)
    if "RESOURCE_EXHAUSTED" not in message or len(AMOUNT.findall(message)) < 2:
        return ""
    return message.split("RESOURCE_EXHAUSTED: ", 1)[-1].splitlines()[0][:300]
