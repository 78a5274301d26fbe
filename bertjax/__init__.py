"""bertjax: BERT-family encoders in JAX/Flax (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA, PERT,
the ModernBERT/Ettin shape, masked-diffusion and causal-LM objectives on the same encoder).

The package's folders are its architecture:

modeling/    the encoder: config, layers, attention, encoder stack, heads, MoE
ops/         the optional speed layer: hand-written backward passes and kernels per platform
objectives/  what a step optimizes: pretraining, ELECTRA, distillation, masked diffusion (+
             sampling), causal LM, PERT, fine-tuning heads, contrastive embeddings
tasks/       fine-tuning data and metrics: built-in tasks, task files, GLUE, embedding pairs
training/    the step, optimizers, sharding, checkpoints, the trainer, metrics, runtime
evaluation/  suites of runs above the trainer: GLUE (`python -m bertjax.glue`), retrieval metrics
data/        corpus -> tokenizer -> token store -> sample plans -> masking -> batches
interop/     Hugging Face weights both ways; read-only bertjax checkpoints
aot/         compiles for a TPU slice or GPU nodes on any host (`python -m bertjax.compile`)
inference/   a trained model's labels, tags, vectors and fill-mask tokens: one checkpoint
             loader, the predictors, the embedder, length batching, the Beam runner
             (`python -m bertjax.predict`, `python -m bertjax.embed`)
reference/   the docs site's generated references: every config key, every objective's batch

The public faces: `bertjax.BertConfig` and the models below, `bertjax.convert` (from_hf,
to_hf), `bertjax.step`, `bertjax.trainer`, `bertjax.data.make_pipeline`, `bertjax.diffusion`,
`bertjax.glue`, `bertjax.embed` (sentence embeddings, retrieval metrics, sentence-transformers),
`bertjax.predict`, `bertjax.compile`. Every command meets bad input the same way (`bertjax.cli`);
paths may be URLs (`bertjax.paths`); storage errors are retried (`bertjax.retry`).
`python -m bertjax.install`, from a checkout, installs bertjax for the host's accelerator keeping
the jax and torch already there (the Colab notebooks' first cell); `bertjax.recipes` finds the
recipes (configs/) in a checkout or an installed wheel.
"""

import importlib

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "ElectraDiscriminator",
    "ElectraGenerator",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """The models load on first use (``bertjax.BertConfig``, ``from bertjax import BertModel``),
    so ``import bertjax.training.runtime`` (train.py's malloc re-exec) does not import jax."""
    if name in __all__:
        return getattr(importlib.import_module("bertjax.modeling"), name)
    raise AttributeError(f"module 'bertjax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
