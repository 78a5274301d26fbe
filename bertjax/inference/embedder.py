"""Sentence embeddings from a trained encoder (what `python -m bertjax.embed` runs): `Embedder`
(the encoder with its pooling, normalization and tokenizer; `encode` -> vectors in input order,
packed rows or length buckets), `load` (a sentence-transformers directory, a bertjax embedding
workdir or a Hugging Face model directory), BEIR metrics of exact search, a corpus's vectors,
and the sentence-transformers export.

Example::

    embedder = bertjax.embed.load("path/to/model")
    vectors = embedder.encode(["what is a coroutine", "Coroutines can be suspended."])
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
from collections.abc import Iterable, Iterator

import jax
import numpy as np

from bertjax import paths
from bertjax.data.text import records
from bertjax.data.text.beir import BeirSet, read_beir
from bertjax.data.tokenizer import Tokenizer
from bertjax.evaluation import retrieval
from bertjax.inference import batching, loading, precision, sorted_apply
from bertjax.inference.loading import TrainedModel
from bertjax.interop import sentence_transformers as st_files
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.embedder import PACKABLE_POOLING, BertForEmbedding, l2_normalize, pool_packed
from bertjax.modeling.encoder import BertModel
from bertjax.ops import platform
from bertjax.tasks.tasks import pair_ids
from bertjax.training import runtime

PACKED_ROW = 128  # the shortest packed row (tokens), and row lengths double from it
# tokens a packed call (perldiag on a 2-core Xeon, interleaved, calls on 2 CPU devices: 512
# gave 1.1x the texts/s of 1024 and 1.3x of 2048; 256 ~512; docs/results/inference.md 2026-12-05)
PACKED_TOKENS_PER_BATCH = 512
# calls of one shape on the first device before that shape's calls go round every CPU device
# (each device compiles its own, ~0.8 s for all-MiniLM; a call saves ~30% once spread)
SPREAD_AFTER = 64


@dataclasses.dataclass
class Embedder:
    """An encoder with its pooling, normalization and tokenizer; `encode` gives vectors."""

    cfg: BertConfig
    params: dict
    tokenizer: Tokenizer
    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = True
    max_seq_length: int = 512

    # several texts a row (segment ids; measured ~1.5x the buckets' texts/s on CPU,
    # benchmarks/inference/predict_throughput.py) where the pooling allows; else length buckets
    packed: bool = True
    # dense products: "auto" (bfloat16 on a CPU with bfloat16 instructions, else float32),
    # "float32" or "bfloat16" (bertjax/inference/precision.py)
    matmul_dtype: str = "auto"

    def __post_init__(self):
        products = precision.matmul_dtype(self.matmul_dtype, "embed")
        self.cfg = self.cfg.replace(dtype="float32", matmul_dtype=products)
        # on the device once: numpy leaves would be copied in at every call, and each call
        # dispatched ahead would hold its own copy (~90 MB for all-MiniLM) until it ran
        self.params = jax.device_put(self.params)
        # what the calls read, on each device they may run on: the kernels in the products'
        # dtype (`export` writes `params`)
        stored = precision.stored_for(self.params, products)
        self._weights = [jax.device_put(stored, device) for device in call_devices()]
        self._calls = collections.Counter()  # packed calls made, by shape
        limit = self.cfg.max_position_embeddings - self.cfg.position_offset
        self.max_seq_length = min(int(self.max_seq_length), limit)
        model = BertForEmbedding(self.cfg, self.pooling, self.normalize)
        self._apply = jax.jit(lambda params, ids, mask: model.apply({"params": params}, ids, mask))
        encoder = BertModel(self.cfg, add_pooler=False)
        pooling, normalize = self.pooling, self.normalize

        def packed(params, ids, segment_ids, segments):
            x, _ = encoder.apply({"params": params["bert"]}, ids, segment_ids=segment_ids)
            vectors = pool_packed(x, segment_ids, segments, pooling)
            return l2_normalize(vectors) if normalize else vectors

        self._apply_packed = jax.jit(packed, static_argnums=3)

    @property
    def dimension(self) -> int:
        return self.cfg.hidden_size * len(self.pooling)

    def encode(
        self,
        texts: list[str],
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
    ) -> np.ndarray:
        """[N, E] float32 vectors of ``texts`` in order: length-sorted batches of about
        ``tokens_per_batch`` tokens (at most ``batch_size`` texts), or packed rows (None: each
        path's default)."""
        return np.concatenate(
            [np.zeros((0, self.dimension), np.float32)]
            + list(self.encode_stream(texts, batch_size, tokens_per_batch))
        )

    def encode_stream(
        self,
        texts: Iterable[str],
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        window: int = sorted_apply.WINDOW,
    ) -> Iterator[np.ndarray]:
        """`encode` of any number of texts, one [n, E] array per ``window`` texts read."""
        for chunk in sorted_apply.windows(texts, window):
            ids, _ = pair_ids(self.tokenizer, chunk, None, self.max_seq_length)
            if self.packed and set(self.pooling) <= set(PACKABLE_POOLING):
                yield self._encode_packed(ids, tokens_per_batch or PACKED_TOKENS_PER_BATCH)
                continue
            apply = lambda i, t, m: self._apply(self._weights[0], i, m)  # noqa: E731
            types = [np.zeros(len(x), np.int32) for x in ids]
            vectors = sorted_apply.apply_sorted(
                apply,
                ids,
                types,
                self.cfg.pad_token_id,
                self.max_seq_length,
                tokens_per_batch or sorted_apply.TOKENS_PER_BATCH,
                batch_size,
            )
            yield np.stack(vectors).astype(np.float32)

    def _encode_packed(self, ids, tokens_per_batch: int) -> np.ndarray:
        """Packed rows of 128, 256, ... tokens up to the longest text's bucket length (one
        compiled shape per row length: batching.packed_batches)."""
        lengths = [len(x) for x in ids]
        top = batching.bucket_of(max(max(lengths), PACKED_ROW), self.max_seq_length)
        row_lengths = [n for n in (PACKED_ROW << k for k in range(8)) if n < top] + [top]
        pending = []
        for batch in batching.packed_batches(lengths, tokens_per_batch, row_lengths):
            (input_ids, segment_ids) = batching.fill(batch, (ids,), (self.cfg.pad_token_id,))
            segments = batch.shape[1] // batching.SEGMENT_TOKENS
            self._calls[batch.shape] += 1
            count = self._calls[batch.shape]
            weights = self._weights[count % len(self._weights) if count > SPREAD_AFTER else 0]
            pending.append((batch, self._apply_packed(weights, input_ids, segment_ids, segments)))
        out = np.zeros((len(ids), self.dimension), np.float32)
        for batch, vectors in pending:
            vectors = np.asarray(vectors)
            number = np.zeros(batch.shape[0], np.int64)
            for text, row in zip(batch.texts, batch.rows):  # texts were filled in this order
                out[text] = vectors[row, number[row]]
                number[row] += 1
        return out

    def export(self, path: str) -> None:
        """Writes a sentence-transformers directory of this embedder."""
        st_files.save(
            self.cfg,
            self.params,
            path,
            pooling=self.pooling,
            normalize=self.normalize,
            tokenizer_file=self.tokenizer.path,
            lowercase=self.tokenizer.lowercase,
            max_seq_length=self.max_seq_length,
        )


def call_devices() -> list:
    """The devices embedding calls go round: every CPU device up to one per usable core
    (`bertjax.training.runtime.cpu_device_per_core` makes them), else the default device."""
    if not platform.on_cpu():
        return jax.local_devices()[:1]
    return jax.local_devices()[: runtime.usable_cores()]


def from_model(
    model: TrainedModel, max_seq_length: int | None = None, matmul_dtype: str = "auto"
) -> Embedder:
    """The embedder of a loaded model (`bertjax.inference.loading`): its encoder without the
    pooler or heads, the pooling and normalization it trained (a sentence-transformers
    directory's modules; mean pooling, normalized, for a model not trained to embed), its
    products in ``matmul_dtype`` (`Embedder.matmul_dtype`)."""
    if model.form == "workdir" and model.task != "embed":
        logging.warning("%s was not trained as an embedding model: mean pooling", model.path)
    bert = {k: v for k, v in model.params["bert"].items() if k != "pooler"}
    length = max_seq_length or model.max_seq_length
    return Embedder(
        model.cfg,
        {"bert": bert},
        model.tokenizer,
        model.pooling,
        model.normalize,
        length,
        matmul_dtype=matmul_dtype,
    )


def load(path: str, max_seq_length: int | None = None, matmul_dtype: str = "auto") -> Embedder:
    """The embedder under ``path``: a sentence-transformers directory, a bertjax workdir or a
    Hugging Face model directory (`bertjax.inference.loading.load`), its products in
    ``matmul_dtype`` (`Embedder.matmul_dtype`)."""
    return from_model(loading.load(path), max_seq_length, matmul_dtype)


def evaluate_beir(
    embedder: Embedder,
    beir: str | BeirSet,
    split: str = "test",
    batch_size: int | None = None,
):
    """NDCG@10, MRR@10 and Recall@100 of exact search over a BEIR directory's corpus (``beir``:
    the directory, or the set `read_beir` read from it)."""
    data = read_beir(beir, split) if isinstance(beir, str) else beir
    doc_ids, query_ids = list(data.corpus), list(data.queries)
    docs = embedder.encode([data.corpus[d] for d in doc_ids], batch_size)
    queries = embedder.encode([data.queries[q] for q in query_ids], batch_size)
    if not embedder.normalize:  # cosine, as training scored it
        docs = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-12)
        queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    run = retrieval.dense_run(query_ids, queries, doc_ids, docs, k=100)
    metrics = retrieval.evaluate_run(run, data.qrels)
    return {**metrics, "queries": len(query_ids), "documents": len(doc_ids)}


def embed_corpus(embedder: Embedder, corpus_file: str, output: str, batch_size: int | None = None):
    """Writes ``ids`` and ``embeddings`` of a corpus.jsonl ({"_id", "title", "text"}) as .npz."""
    ids, texts = [], []
    for where, record in records.iter_located(corpus_file, "--corpus"):
        if "_id" not in record:
            raise ValueError(f"{where}: no '_id'")
        ids.append(str(record["_id"]))
        texts.append(" ".join(str(record.get(k) or "") for k in ("title", "text")).strip())
    buffer = io.BytesIO()
    np.savez(buffer, ids=np.asarray(ids), embeddings=embedder.encode(texts, batch_size))
    paths.write_bytes(output, buffer.getvalue())
