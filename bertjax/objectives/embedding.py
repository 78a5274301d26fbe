"""Embedding / retrieval fine-tuning: contrastive training of the one encoder on (query, positive
[, hard negatives]) pairs.

``config.loss.objective = "embedding"`` (`add_embedding_config` sets up a run): the encoder pools
each text into a vector (`bertjax.modeling.embedder`), and the loss is InfoNCE over the global
batch's documents (`bertjax.objectives.contrastive`: MultipleNegativesRankingLoss, optionally
symmetric, Matryoshka) with a fixed or learned scale. The loss is computed on the whole global
batch under jit, so the negatives of each query span every device and host. Gradient
accumulation would shrink the negatives to a microbatch (the step refuses it: the objective is
not ``microbatch_additive``); GradCache (``config.loss.gradcache_chunk_size``, the objective's
`gradients` hook) gives the whole batch's negatives at a chunk's memory.
The data source is `bertjax.tasks.embedding_data.PairData`; held-out metrics are NDCG@10,
MRR@10 and Recall@100 of the held-out queries against the held-out documents.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.interop import sentence_transformers as st_files
from bertjax.modeling.embedder import BertForEmbedding, check_pooling, learned_scale
from bertjax.objectives.base import Objective, derived, example_rows
from bertjax.objectives.contrastive import matryoshka_info_nce
from bertjax.objectives.finetune import merge_encoder
from bertjax.objectives.gradcache import gradcache_gradients


def default_pairs_config() -> ml_collections.ConfigDict:
    """``config.pairs``: the training pairs and the held-out split."""
    c = ml_collections.ConfigDict()
    c.source = "builtin"  # "builtin" (CPython docs, no download) | a .jsonl/.parquet path or URL
    c.dev_file = ""  # held-out pairs file ("" = a dev_fraction of source, by hash of the query)
    c.dev_fraction = 0.1  # share of pairs held out when dev_file is ""
    c.query_field = "query"  # JSONL / Parquet field names
    c.positive_field = "positive"  # the field of the query's relevant document
    c.negatives_field = "negatives"  # list of hard negatives (optional in the file)
    c.num_negatives = 0  # hard negatives per query (missing ones: random other documents)
    c.max_query_length = 32  # query rows (documents: config.data.max_seq_length)
    return c


def add_embedding_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Turns a `default_run_config()` into an embedding run (call before the config is locked):
    ``config.pairs``, and the `Embedding` settings at their defaults in ``config.loss``."""
    config.init_from = ""  # "" (random) | bertjax workdir | HF dir | sentence-transformers dir
    config.pairs = default_pairs_config()
    Embedding.add_config(config)
    config.eval_batches = 0  # every held-out pair
    config.mlm_bias_init = "zeros"  # no MLM head
    return config


class Embedding(Objective):
    """Contrastive embedding objective (see the module docstring). Not `microbatch_additive`:
    each query's negatives are the whole batch's documents, so the step refuses gradient
    accumulation (GradCache is the way to large batches)."""

    objective_name = "embedding"

    corruptions = None  # reads pairs, no pretraining corruption
    input_names = ("input_ids", "attention_mask")  # of queries, and of documents (apply)
    microbatch_additive = False
    headline_metrics = ("ndcg@10", "mrr@10", "recall@100")
    loads_init_from = True  # the encoder of config.init_from, in prepare_state

    # "auto" (a sentence-transformers init_from's modes, else mean) | comma-separated modes:
    # cls, mean, max, mean_sqrt_len_tokens, lasttoken (concatenated); from_config resolves it
    # into the tuple of modes
    pooling: str | tuple = "auto"
    normalize: bool | None = None  # unit-length outputs (None: init_from's, else on)
    similarity: str = "cos"  # "cos" | "dot"
    scale: float = 20.0  # 1 / temperature (sentence-transformers' MNRL: 20; BGE: 50 = 1 / 0.02)
    learn_scale: bool = False  # learn log(scale) from scale (clipped at 100, as CLIP)
    symmetric: bool = False  # add the document -> query direction
    matryoshka_dims: tuple = ()  # prefix widths trained jointly (() = the full width only)
    matryoshka_weights: tuple = ()  # their loss weights (() = 1 each)
    gradcache_chunk_size: int = 0  # > 0: GradCache with chunks of this many queries
    documents_per_query: int = derived(1)  # positive + hard negatives (for the FLOP count)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        pooling = self.pooling
        if pooling == "auto":
            pooling = ("mean",)
        elif isinstance(pooling, str):
            pooling = tuple(p.strip() for p in pooling.split(","))
        set_("pooling", check_pooling(tuple(pooling), "config.loss.pooling"))
        set_("normalize", True if self.normalize is None else bool(self.normalize))
        set_("matryoshka_dims", tuple(int(d) for d in self.matryoshka_dims))
        set_("matryoshka_weights", tuple(float(w) for w in self.matryoshka_weights))

    def validate(self):
        if self.similarity not in ("cos", "dot"):
            raise ValueError(f"config.loss.similarity={self.similarity!r}: 'cos' or 'dot'")
        if not self.scale > 0:
            raise ValueError(f"config.loss.scale={self.scale}: must be > 0")
        dims, weights = self.matryoshka_dims, self.matryoshka_weights
        if any(d <= 0 for d in dims) or (weights and len(weights) != len(dims)):
            raise ValueError(
                f"config.loss.matryoshka_dims={dims} / matryoshka_weights={weights}: positive "
                "widths, and one weight per width (or none)"
            )
        if self.gradcache_chunk_size < 0:
            raise ValueError(
                f"config.loss.gradcache_chunk_size={self.gradcache_chunk_size}: must be >= 0"
            )

    @classmethod
    def from_config(cls, config):
        """The settings, with "auto" pooling and an unset normalize taken from a
        sentence-transformers ``config.init_from``, and the hard negatives of ``config.pairs``."""
        values = cls.settings(config)
        if config.get("init_from") and st_files.is_sentence_transformers_dir(config.init_from):
            modules = st_files.read_modules(config.init_from)
            if values.get("pooling", "auto") == "auto":
                values["pooling"] = modules.pooling
            if values.get("normalize") is None:
                values["normalize"] = modules.normalize
        negatives = int(config.pairs.num_negatives) if "pairs" in config else 0
        return cls(**values, documents_per_query=1 + negatives)

    def model(self, cfg):
        return BertForEmbedding(cfg, self.pooling, self.normalize, self.learn_scale, self.scale)

    def init_batch(self, cfg):
        ids = jnp.zeros((1, min(8, cfg.max_position_embeddings - cfg.position_offset)), jnp.int32)
        return {"input_ids": ids, "attention_mask": ids + 1}

    def example_batch(self, cfg, rows, length, seed):
        """Queries of ``length`` tokens, each with its positive and one hard negative (padded
        rows), and a zero weight on the last row (a padding row of a held-out batch)."""
        queries = example_rows(cfg, rows, length, seed)
        docs = example_rows(cfg, rows * 2, length, seed + 1)
        weights = np.ones(rows, np.float32)
        weights[-1] = 0.0
        return {
            "input_ids": queries["input_ids"],
            "attention_mask": queries["attention_mask"],
            "doc_input_ids": docs["input_ids"].reshape(rows, 2, length),
            "doc_attention_mask": docs["attention_mask"].reshape(rows, 2, length),
            "weights": weights,
        }

    def apply(self, model, variables, batch, rngs, deterministic):
        """{"query": [B, E], "docs": [B, K, E], "scale": scalar}: queries, each query's positive
        and hard negatives, and the contrastive scale."""

        def embed(rows, stream):
            stream_rngs = (
                None if rngs is None else {"dropout": jax.random.fold_in(rngs["dropout"], stream)}
            )
            return model.apply(
                variables, **self.model_inputs(rows), deterministic=deterministic, rngs=stream_rngs
            )

        query = embed(batch, 0)
        ids = batch["doc_input_ids"]
        rows, slots, length = ids.shape
        docs = {
            "input_ids": ids.reshape(rows * slots, length),
            "attention_mask": batch["doc_attention_mask"].reshape(rows * slots, length),
        }
        return {
            "query": query,
            "docs": embed(docs, 1).reshape(rows, slots, -1),
            "scale": self._scale(variables["params"]),
        }

    def _scale(self, params):
        return learned_scale(params) if self.learn_scale else jnp.float32(self.scale)

    def loss_sums(self, outputs, batch):
        weights = batch["weights"].astype(jnp.float32)
        loss, hits = matryoshka_info_nce(
            outputs["query"],
            outputs["docs"],
            outputs["scale"],
            weights,
            self.symmetric,
            self.similarity,
            self.matryoshka_dims,
            self.matryoshka_weights,
        )
        return {
            "loss": jnp.sum(loss * weights),
            "in_batch_accuracy": jnp.sum(hits * weights),
            "scale": outputs["scale"] * jnp.sum(weights),
        }

    def normalizers(self, batch):
        queries = jnp.sum(batch["weights"].astype(jnp.float32))
        return {"queries": jnp.where(queries > 0, queries, 1.0)}

    def total_loss(self, sums, norms):
        return sums["loss"] / norms["queries"]

    def metrics(self, sums, norms):
        """in_batch_accuracy (the positive outranks every in-batch candidate) and scale."""
        return {
            "in_batch_accuracy": sums["in_batch_accuracy"] / norms["queries"],
            "scale": sums["scale"] / norms["queries"],
        }

    def gradients(self, grad_fn, model):
        """GradCache when ``gradcache_chunk_size`` > 0 (the step's own autodiff otherwise).
        ``batch`` is the whole global batch (not `microbatch_additive`), so its norms are the
        step's."""
        if not self.gradcache_chunk_size:
            return grad_fn

        def gradcache_grad_fn(params, batch, rng):
            chunks = max(batch["input_ids"].shape[0] // self.gradcache_chunk_size, 1)
            norms = self.norms(batch)

            def embed(p, chunk, key):
                out = self.apply(model, {"params": p}, chunk, {"dropout": key}, False)
                return {"query": out["query"], "docs": out["docs"]}

            def loss(p, embeddings):
                sums = self.sums({**embeddings, "scale": self._scale(p)}, batch)
                return self.loss(sums, norms), sums

            return gradcache_gradients(embed, loss, params, batch, rng, chunks)

        return gradcache_grad_fn

    def predictions(self, outputs):
        """[B, 2, E]: each query's vector and its positive's (held-out retrieval metrics)."""
        return jnp.concatenate([outputs["query"][:, None], outputs["docs"][:, :1]], axis=1)

    def train_flops_per_sequence(self, cfg, seq_len, masked_per_sequence, masked_width, count):
        """The encoder on the query and on each of its documents (all counted at the query
        row's length); GradCache adds a forward pass (x 4/3)."""
        flops = count(cfg, seq_len, 0.0) * (1 + self.documents_per_query)
        return flops * (4.0 / 3.0 if self.gradcache_chunk_size else 1.0)

    def make_data(self, config, workdir):
        from bertjax.tasks.embedding_data import PairData

        return PairData(config, workdir, self)

    def prepare_state(self, state, data):
        """``state`` with the init_from encoder weights (unchanged when init_from is empty)."""
        if data.pretrained is None:
            return state
        params = merge_encoder(state.params, data.pretrained_encoder(), data.pretrained_path)
        return state.replace(params=params)
