"""Embedding / retrieval fine-tuning: contrastive training of the one encoder on (query, positive
[, hard negatives]) pairs.

``config.loss.objective = "embedding"`` (`add_embedding_config` sets up a run): the encoder pools
each text into a vector (`bertjax.modeling.embedder`), and the loss is InfoNCE over the global
batch's documents (`bertjax.objectives.contrastive`: MultipleNegativesRankingLoss, optionally
symmetric, Matryoshka) with a fixed or learned scale. The loss is computed on the whole global
batch under jit, so the negatives of each query span every device and host. Gradient
accumulation would shrink the negatives to a microbatch; GradCache
(``config.loss.gradcache_chunk_size``) gives the whole batch's negatives at a chunk's memory.
The data source is `bertjax.objectives.embedding_data.PairData`; held-out metrics are NDCG@10,
MRR@10 and Recall@100 of the held-out queries against the held-out documents.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from bertjax.interop import sentence_transformers as st_files
from bertjax.modeling.embedder import BertForEmbedding, check_pooling, learned_scale
from bertjax.objectives.base import Objective
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
    c.positive_field = "positive"
    c.negatives_field = "negatives"  # list of hard negatives (optional in the file)
    c.num_negatives = 0  # hard negatives per query (missing ones: random other documents)
    c.max_query_length = 32  # query rows (documents: config.data.max_seq_length)
    return c


def add_embedding_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Turns a `default_run_config()` into an embedding run (call before the config is locked)."""
    config.init_from = ""  # "" (random) | bertjax workdir | HF dir | sentence-transformers dir
    config.pairs = default_pairs_config()
    loss = config.loss
    loss.objective = "embedding"
    # "auto" (a sentence-transformers init_from's modes, else "mean") | comma-separated modes:
    # cls, mean, max, mean_sqrt_len_tokens, lasttoken (concatenated)
    loss.pooling = "auto"
    loss.normalize = config_dict.placeholder(
        bool
    )  # unit-length outputs (None: init_from's, else on)
    loss.similarity = "cos"  # "cos" | "dot"
    loss.scale = 20.0  # 1 / temperature (sentence-transformers' MNRL: 20; BGE: 50 = 1 / 0.02)
    loss.learn_scale = False  # learn log(scale) from loss.scale (clipped at 100, as CLIP)
    loss.symmetric = False  # add the document -> query direction
    loss.matryoshka_dims = ()  # prefix widths trained jointly (() = the full width only)
    loss.matryoshka_weights = ()  # their loss weights (() = 1 each)
    loss.gradcache_chunk_size = 0  # > 0: GradCache with chunks of this many queries
    config.eval_batches = 0  # every held-out pair
    config.mlm_bias_init = "zeros"  # no MLM head
    return config


@dataclasses.dataclass(frozen=True)
class Embedding(Objective):
    """Contrastive embedding objective (see the module docstring)."""

    extra_config_keys = (
        "pooling",
        "normalize",
        "similarity",
        "scale",
        "learn_scale",
        "symmetric",
        "matryoshka_dims",
        "matryoshka_weights",
        "gradcache_chunk_size",
    )
    loads_init_from = True  # the encoder of config.init_from, in prepare_state

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = True
    similarity: str = "cos"
    scale: float = 20.0
    learn_scale: bool = False
    symmetric: bool = False
    matryoshka_dims: tuple[int, ...] = ()
    matryoshka_weights: tuple[float, ...] = ()
    gradcache_chunk_size: int = 0
    documents_per_query: int = 1  # positive + hard negatives (for the FLOP count)

    @classmethod
    def from_config(cls, config):
        loss = config.loss
        modules = None
        if config.get("init_from") and st_files.is_sentence_transformers_dir(config.init_from):
            modules = st_files.read_modules(config.init_from)
        pooling = loss.get("pooling", "auto")
        if pooling == "auto":
            pooling = modules.pooling if modules else ("mean",)
        elif isinstance(pooling, str):
            pooling = tuple(p.strip() for p in pooling.split(","))
        pooling = check_pooling(pooling, "config.loss.pooling")
        normalize = loss.get("normalize")
        if normalize is None:
            normalize = modules.normalize if modules else True
        if loss.get("similarity", "cos") not in ("cos", "dot"):
            raise ValueError(f"config.loss.similarity={loss.similarity!r}: 'cos' or 'dot'")
        if not float(loss.get("scale", 20.0)) > 0:
            raise ValueError(f"config.loss.scale={loss.scale}: must be > 0")
        dims = tuple(int(d) for d in loss.get("matryoshka_dims", ()))
        weights = tuple(float(w) for w in loss.get("matryoshka_weights", ()))
        if any(d <= 0 for d in dims) or (weights and len(weights) != len(dims)):
            raise ValueError(
                f"config.loss.matryoshka_dims={dims} / matryoshka_weights={weights}: positive "
                "widths, and one weight per width (or none)"
            )
        chunk = int(loss.get("gradcache_chunk_size", 0))
        if chunk < 0:
            raise ValueError(f"config.loss.gradcache_chunk_size={chunk}: must be >= 0")
        if "optim" in config and int(config.optim.grad_accum_steps) > 1:
            raise ValueError(
                "config.optim.grad_accum_steps > 1 would take each query's negatives from its "
                "microbatch only; use config.loss.gradcache_chunk_size for large batches"
            )
        negatives = int(config.pairs.num_negatives) if "pairs" in config else 0
        return cls(
            pooling,
            bool(normalize),
            loss.get("similarity", "cos"),
            float(loss.get("scale", 20.0)),
            bool(loss.get("learn_scale", False)),
            bool(loss.get("symmetric", False)),
            dims,
            weights,
            chunk,
            1 + negatives,
        )

    def model(self, cfg):
        return BertForEmbedding(cfg, self.pooling, self.normalize, self.learn_scale, self.scale)

    def init_batch(self, cfg):
        ids = jnp.zeros((1, min(8, cfg.max_position_embeddings - cfg.position_offset)), jnp.int32)
        return {"input_ids": ids, "attention_mask": ids + 1}

    def model_inputs(self, batch):
        return batch["input_ids"], batch.get("attention_mask")

    def apply(self, model, variables, batch, rngs, deterministic):
        """{"query": [B, E], "docs": [B, K, E], "scale": scalar}: queries, each query's positive
        and hard negatives, and the contrastive scale."""

        def embed(ids, mask, stream):
            stream_rngs = (
                None if rngs is None else {"dropout": jax.random.fold_in(rngs["dropout"], stream)}
            )
            return model.apply(variables, ids, mask, deterministic=deterministic, rngs=stream_rngs)

        query = embed(batch["input_ids"], batch["attention_mask"], 0)
        ids = batch["doc_input_ids"]
        rows, slots, length = ids.shape
        flat = embed(
            ids.reshape(rows * slots, length),
            batch["doc_attention_mask"].reshape(rows * slots, length),
            1,
        )
        return {
            "query": query,
            "docs": flat.reshape(rows, slots, -1),
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

    def gradients(self, model, params, batch, rng, norms):
        """GradCache when ``gradcache_chunk_size`` > 0 (None: the step's own autodiff)."""
        if not self.gradcache_chunk_size:
            return None
        chunks = max(batch["input_ids"].shape[0] // self.gradcache_chunk_size, 1)

        def embed(p, chunk, key):
            out = self.apply(model, {"params": p}, chunk, {"dropout": key}, deterministic=False)
            return {"query": out["query"], "docs": out["docs"]}

        def loss(p, embeddings):
            sums = self.loss_sums({**embeddings, "scale": self._scale(p)}, batch)
            return self.loss(sums, norms), sums

        return gradcache_gradients(embed, loss, params, batch, rng, chunks)

    def predictions(self, outputs):
        """[B, 2, E]: each query's vector and its positive's (held-out retrieval metrics)."""
        return jnp.concatenate([outputs["query"][:, None], outputs["docs"][:, :1]], axis=1)

    def train_flops_per_sequence(self, cfg, seq_len, masked_per_sequence, masked_width, count):
        """The encoder on the query and on each of its documents (all counted at the query
        row's length); GradCache adds a forward pass (x 4/3)."""
        flops = count(cfg, seq_len, 0.0) * (1 + self.documents_per_query)
        return flops * (4.0 / 3.0 if self.gradcache_chunk_size else 1.0)

    def make_data(self, config, workdir):
        from bertjax.objectives.embedding_data import PairData

        return PairData(config, workdir, self)

    def prepare_state(self, state, data):
        """``state`` with the init_from encoder weights (unchanged when init_from is empty)."""
        if data.pretrained is None:
            return state
        params = merge_encoder(state.params, data.pretrained_encoder(), data.pretrained_path)
        return state.replace(params=params)
