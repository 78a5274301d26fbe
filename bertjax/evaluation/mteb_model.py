"""A bertjax embedder as MTEB runs a model: `MtebEncoder` answers mteb 2's encode protocol
(``encode(inputs: DataLoader, *, task_metadata, hf_split, hf_subset, prompt_type, **kw)`` ->
[N, E] vectors), so ``mteb.evaluate(MtebEncoder(...), tasks)`` scores it like any model.

Prompts follow sentence-transformers: a prompt is text put before each input, chosen by mteb's
own rule (``AbsEncoder.get_prompt_name``: task name and prompt type first, then the task, the
task type, and the prompt type "query" or "document"). A sentence-transformers directory brings
its ``config_sentence_transformers.json`` prompts; `prompts_of` adds those given by hand.

`model_meta` fills mteb's ``ModelMeta`` from what bertjax knows of the model it loaded: its name
(``bertjax/<directory>`` unless given), a revision that changes with its files (the loader's
fingerprint), its parameters (what runs: the encoder, no pooler) and input table, embedding
width, token limit, similarity (cosine), its language and the model it was fine-tuned from (a
workdir's run config), and the products' dtype when not float32 (mteb keeps such a run apart:
``experiment_kwargs``).

Importing this module imports mteb (``pip install 'bertjax[mteb]'``).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from mteb.models import ModelMeta
from mteb.models.abs_encoder import AbsEncoder

from bertjax import paths
from bertjax.inference import loading
from bertjax.inference.embedder import Embedder
from bertjax.inference.loading import TrainedModel

# config.data.language -> mteb's language codes (ISO 639-3 and script).
LANGUAGES = {"en": ["eng-Latn"], "zh": ["zho-Hans"]}
PROMPT_TYPES = ("query", "document")


class MtebEncoder(AbsEncoder):
    """An `Embedder` behind mteb's encoder protocol (module docstring)."""

    def __init__(
        self,
        embedder: Embedder,
        meta: ModelMeta,
        prompts: dict[str, str] | None = None,
        batch_size: int | None = None,
    ):
        self.model = embedder
        self.mteb_model_meta = meta
        self.model_prompts = self.validate_task_to_prompt_name(prompts or None)
        self.batch_size = batch_size

    def prompt(self, task_metadata, prompt_type) -> str:
        """The text put before each input of this task and prompt type ("" for none)."""
        name = self.get_prompt_name(task_metadata, prompt_type)
        return self.model_prompts.get(name, "") if name and self.model_prompts else ""

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        """[N, E] float32 vectors of the texts of ``inputs`` (mteb's DataLoader of batches with
        a "text" list), in order; mteb's batch size only shapes its DataLoader (bertjax batches
        by tokens: `Embedder.encode`)."""
        prefix = self.prompt(task_metadata, prompt_type)
        texts = [prefix + text for batch in inputs for text in batch["text"]]
        return self.model.encode(texts, self.batch_size)


def prompts_of(path: str, query: str = "", document: str = "") -> dict[str, str]:
    """The prompts of the model under ``path`` (a sentence-transformers directory's
    ``config_sentence_transformers.json`` "prompts"), with ``query`` and ``document`` given by
    hand replacing its own; empty prompts are left out."""
    prompts = {}
    config_file = paths.join(path, "config_sentence_transformers.json")
    if paths.isfile(config_file):
        try:
            saved = json.loads(paths.read_text(config_file)).get("prompts") or {}
        except json.JSONDecodeError as error:
            raise ValueError(f"{config_file} is not valid JSON: {error}") from error
        if not isinstance(saved, dict):
            raise ValueError(f"{config_file}: 'prompts' must map a name to a text")
        prompts.update({str(k): str(v) for k, v in saved.items()})
    for name, text in (("query", query), ("document", document)):
        if text:
            prompts[name] = text
    return {name: text for name, text in prompts.items() if text}


def _sizes(tree) -> tuple[int, int]:
    """(parameters, bytes) of a parameter tree."""
    leaves = jax.tree.leaves(tree)
    return sum(int(np.size(x)) for x in leaves), sum(
        int(np.size(x)) * x.dtype.itemsize for x in leaves
    )


def model_meta(
    model: TrainedModel,
    embedder: Embedder,
    name: str = "",
    prompts: dict[str, str] | None = None,
) -> ModelMeta:
    """mteb's ModelMeta of ``embedder``, loaded from ``model`` (module docstring)."""
    name = name or f"bertjax/{os.path.basename(os.path.normpath(model.path))}"
    if name.count("/") != 1 or not all(name.split("/")):
        raise ValueError(f"--model_name={name!r}: mteb names a model ORGANIZATION/NAME")
    parameters, size = _sizes(embedder.params)
    # mteb's "embedding parameters": the input table (vocabulary x width), as it counts them
    words = embedder.params["bert"]["embeddings"]["word_embeddings"]
    language = model.run.get("data", {}).get("language") if model.form == "workdir" else None
    products = embedder.cfg.matmul_dtype or "float32"  # None: the activations' float32
    return ModelMeta(
        loader=None,
        name=name,
        revision=loading.fingerprint(model.path),
        release_date=None,
        languages=LANGUAGES.get(language),
        n_parameters=parameters,
        n_embedding_parameters=int(np.size(words)),
        memory_usage_mb=round(size / 2**20, 1),
        max_tokens=embedder.max_seq_length,
        embed_dim=embedder.dimension,
        license=None,
        open_weights=None,
        public_training_code=None,
        public_training_data=None,
        framework=["JAX"],
        similarity_fn_name="cosine",
        use_instructions=bool(prompts),
        training_datasets=None,
        adapted_from=model.run.get("init_from") or None,
        experiment_kwargs=None if products == "float32" else {"matmul_dtype": products},
    )
