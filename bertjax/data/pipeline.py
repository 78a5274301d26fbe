"""The data pipeline: `make_pipeline(config, workdir).batch(step)` = this host's rows of global
batch `step`.

The global batch of a step is a pure function of (config, seed, step): with row length T and
ordinal r of the step among steps of that length (see schedule.py), epoch = r // steps_per_epoch(T)
and the step takes positions (r % steps_per_epoch(T)) * B + [0, B) of that epoch's shuffled plan.
Rows are masked with keys (seed, epoch, step * B + row), so any host/worker/prefetch split and any
restart give the same rows, and each epoch masks differently. The sentence plans are built per
piece of the store and read in a two-level stateless shuffle (piece_plans.py, epoch_order.py): a
host builds only the pieces its rows fall in, whatever the store's size and the host count; an
epoch's size is fixed from epoch 0's plans, and a piece with fewer units in a later epoch wraps
around (NSP plans vary per epoch). token_windows rows are computed by index (plans/epochs.py).

A batch is made in three stages: its rows are located in their plans (`locate_rows`: store
positions, no tokens read), read (the rows of `read_steps` consecutive batches at once, one
round of ranges for a sharded store), and built and masked. Batches ahead of the step asked for
are computed in the background (prefetch.py), in threads or worker processes; how many, and how
the store is read, come from read_settings.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Iterator

import numpy as np

from bertjax import retry
from bertjax.data import corpus_pin, data_config, read_settings, workers
from bertjax.data.batch_rows import BatchRows, Located
from bertjax.data.corruption import causal, masking, similarity
from bertjax.data.plan_version import PLAN_VERSION
from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.data.plans.epochs import SplitEpochs
from bertjax.data.plans.schedule import LengthSchedule
from bertjax.data.prefetch import CLOSE_WAIT_S, Prefetch
from bertjax.data.source import DataSource, host_rows
from bertjax.data.store import configured as store_config
from bertjax.data.store.cache_budget import CacheBudget
from bertjax.data.store.memmap import Store
from bertjax.data.text import hub
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer.configured import load_tokenizer


class Pipeline(BatchRows, DataSource):
    """Deterministic, restartable pretraining batches for one host; see the module docstring."""

    plan_version = PLAN_VERSION

    def __init__(
        self,
        config,
        tokenizer: Tokenizer,
        store: Store,
        *,
        process_index: int,
        process_count: int,
        similar=None,
        eval_store: Store | None = None,
        reads: read_settings.ReadSettings | None = None,
        cache: CacheBudget | None = None,
    ):
        """``reads``: how the store is read (read_settings.py; None: chosen for ``store`` as a
        local store); ``cache``: the bound its stores' block caches share (None: a local
        store's, memory-mapped)."""
        c = self.c = config.data
        self.config, self.tokenizer, self.store = config, tokenizer, store
        self.global_batch_size = config.batch_size
        self.process_index, self.process_count = process_index, process_count
        self.cache = cache
        self._batches = BatchPlan.from_config(config, c.max_seq_length)
        if self._batches.sizes and c.length_schedule:
            raise ValueError(
                "config.batch_warmup with config.data.length_schedule: a growing batch indexes "
                "one length's samples; give each length its own phase (config.phases)"
            )
        for size in {*self._batches.sizes, self._batches.final}:
            host_rows(size, process_index, process_count)  # every size divides over the hosts
        per_host = config.batch_size // process_count
        # lanes of rows (epoch_order.py) hold only where a step's rows start at B * step
        self._lane_rows = 0 if self._batches.sizes else c.lane_rows
        purpose = "train" if store.split == "train" else "eval"
        self._split = self._epochs(store, purpose)
        self.reads = reads or read_settings.choose(c, sharded=False, host_rows=per_host)
        self._eval_store = eval_store
        self._eval_split = None
        self._schedule = LengthSchedule(
            c.max_seq_length,
            c.length_schedule,
            c.mixed_lengths,
            config.get("num_train_steps"),
            config.seed,
        )
        self._similar = similar
        self._token_weights = None
        if c.mask_token_weighting == "smoothed_unigram":
            self._token_weights = masking.smoothed_unigram_weights(
                self.token_counts(), tokenizer.special, c.mask_token_smoothing
            )
        self._mask_spec = masking.MaskSpec(
            mode=c.masking,
            rate=c.mask_rate,
            max_predictions=c.max_predictions,
            mask_token_prob=c.mask_token_prob,
            random_token_prob=c.random_token_prob,
            ngram_probs=data_config.ngram_probabilities(c),
            diffusion_eps=c.diffusion_eps,
            permute_prob=c.permute_prob,
        )
        self._eval_mask_spec = dataclasses.replace(
            self._mask_spec,
            rate=c.eval_mask_rate or c.mask_rate,
            max_predictions=c.eval_max_predictions or c.max_predictions,
        )
        self._special_ids = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
        self._prefetch = None
        if self.reads.prefetch:
            threads = concurrent.futures.ThreadPoolExecutor(
                self.reads.prefetch_threads, "bertjax-data"
            )
            self._prefetch = Prefetch(
                self.compute_batches, threads, self.reads.prefetch, self.reads.read_steps
            )

    def _epochs(self, store: Store, purpose: str) -> SplitEpochs:
        return SplitEpochs(
            store,
            self.config,
            self.global_batch_size,
            purpose,
            lane_rows=self._lane_rows,
            host_rows=self.global_batch_size // self.process_count,
        )

    @property
    def fingerprint(self) -> str:
        """The token store's fingerprint (tokenizer, corpus, counts)."""
        return self.store.fingerprint

    def unigram_log_prior(self, max_tokens: int = 50_000_000) -> np.ndarray:
        """[V] float32 log frequency of each token in the training split (add-one smoothed;
        special tokens get the floor), from an evenly strided sample of at most `max_tokens`
        tokens (a sharded store: exact counts from its shard indexes).

        The MLM output bias starts here, so a new model predicts the unigram distribution from step
        0
        instead of spending its first steps (and the tied embeddings) learning token frequencies."""
        vocab = self.tokenizer.vocab_size
        counts = self.store.token_counts(max_tokens)[:vocab].astype(np.float64)
        never_predicted = (
            self.tokenizer.special.copy()
        )  # [CLS], [SEP], [PAD], [MASK]; [UNK] is a real token
        if self.tokenizer.unk_id is not None:
            never_predicted[self.tokenizer.unk_id] = False
        counts[never_predicted] = 0.0
        return np.log((counts + 1.0) / (counts.sum() + vocab)).astype(np.float32)

    def token_counts(self, chunk: int = 1 << 24) -> np.ndarray:
        """[V] int64 occurrences of each token in the training split (every token; a local store
        is counted ``chunk`` tokens at a time)."""
        return self.store.token_counts(chunk=chunk)

    def seq_len(self, step: int) -> int:
        """Row length T of the batch of `step` (known ahead of time)."""
        return self._schedule(step)[0]

    @property
    def steps_per_epoch(self) -> int:
        """Steps per pass over the corpus at config.data.max_seq_length."""
        return self._split.steps_per_epoch(self.c.max_seq_length)

    def step_batch_size(self, step: int) -> int:
        """Global batch size of ``step`` (bertjax/data/plans/batch_plan.py)."""
        return self._batches.batch(step)

    def mask_rows(self, out: dict[str, np.ndarray], spec=None) -> dict[str, np.ndarray]:
        """Masked batch of host rows; `spec` (held-out batches) masks tokens uniformly."""
        if self.c.masking == "causal":  # held-out rows: no input masking (exact NLL)
            masked = causal.causal_batch(
                out["input_ids"],
                out.get("segment_ids", out["attention_mask"]),
                out["maskable"],
                out["row_keys"],
                0.0 if spec is not None else float(self.c.input_mask_rate),
                self.tokenizer.mask_id,
            )
        else:
            masked = masking.mask_batch(
                out["input_ids"],
                out["maskable"],
                out["word_starts"],
                out["row_keys"],
                spec or self._mask_spec,
                mask_id=self.tokenizer.mask_id,
                normal_ids=self.tokenizer.normal_ids,
                similar=self._similar,
                token_weights=self._token_weights if spec is None else None,
            )
        batch = {
            "input_ids": masked["input_ids"],
            "token_type_ids": out["token_type_ids"],
            "attention_mask": out["attention_mask"],
        }
        if "segment_ids" in out:
            batch["segment_ids"] = out["segment_ids"]
        # PERT predicts positions (target_positions), not tokens: it has no masked_ids
        targets = ("target_positions",) if "target_positions" in masked else ("masked_ids",)
        for key in ("masked_positions", *targets, "masked_weights"):
            batch[key] = masked[key]
        batch["next_sentence_label"] = out["next_sentence_label"].astype(np.int32)
        batch["mask_ratio"] = masked["mask_ratio"]
        return batch

    def _locate_step(self, step: int) -> Located:
        """This host's rows of global batch ``step``, located."""
        length, ordinal = self._schedule(step)
        batch = self._batches.batch(step)
        if self._batches.sizes:  # a growing batch: samples consumed (one length, ordinal = step)
            first = key_base = self._batches.samples_before(step)
        else:
            first, key_base = ordinal * batch, step * batch
        return self._rows(self._split, length, first, batch, key_base, "mask")

    def compute_batches(self, steps: list[int]) -> list[dict[str, np.ndarray]]:
        """This host's rows of the global batches ``steps``, computed now: their rows read
        together (one round of ranges for a sharded store), then built and masked."""
        located = [self._locate_step(int(step)) for step in steps]
        read = self.read_rows(located)
        return [self.mask_rows(self.build_rows(loc, got)) for loc, got in zip(located, read)]

    def compute_batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of global batch `step`, computed now (no prefetch)."""
        return self.compute_batches([step])[0]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of global batch `step`; the batches of the next `prefetch` steps are
        computed in the background, `read_steps` at a time (prefetch.py)."""
        if self._prefetch is None:
            return self.compute_batch(int(step))
        return self._prefetch.batch(int(step), self.compute_batch)

    def eval_batches(self, num_batches: int) -> Iterator[dict[str, np.ndarray]]:
        """`num_batches` fixed batches (same every call) of the held-out split at max_seq_length."""
        if self._eval_store is None:
            raise ValueError(
                f"{self.store.directory} has no held-out documents (config.data.heldout_fraction"
                f"={self.c.heldout_fraction}; a corpus of one document trains on it): set "
                "config.eval_every=0 to train without held-out evaluation, or give a "
                "heldout_fraction > 0 and a corpus of two or more documents"
            )
        if self._eval_split is None:
            self._eval_split = self._epochs(self._eval_store, "eval")
        for i in range(num_batches):
            first = i * self.global_batch_size
            located = self._rows(
                self._eval_split, self.c.max_seq_length, first, self.global_batch_size, first,
                "eval-mask",
            )  # fmt: skip
            rows_i = self.build_rows(located, self.read_rows([located])[0])
            yield self.mask_rows(rows_i, self._eval_mask_spec)

    def start_workers(self, workdir: str) -> None:
        """Prefetched batches computed in config.data.workers processes (data/workers.py), a
        read (`read_steps` batches) each at a time; each holds its share of the host's block
        caches (read_settings.py), as this process does."""
        if self._prefetch is not None:
            self._prefetch.close()
        config = self.config.copy_and_resolve_references()
        config.data.store_cache_bytes = max(1, self.reads.process_cache_bytes)
        pool = workers.process_pool(
            make_pipeline, config, workdir, self.process_index, self.process_count
        )
        ahead = max(self.reads.prefetch, self.c.workers * self.reads.read_steps)
        self._prefetch = Prefetch(
            workers.compute_batches, pool, ahead, self.reads.read_steps, end=self._end
        )

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stops background work (prefetch threads or worker processes, the stores' read
        threads) and drops the stores' cached blocks: a phase of the run ended. Returns within
        ``timeout_s``: a read hung in storage is left behind (its thread ends with the read or
        with the process)."""
        deadline = time.monotonic() + timeout_s
        if self._prefetch is not None:
            self._prefetch.close(timeout_s)
        for store in (self.store, self._eval_store):
            if store is not None:
                store.close(max(0.0, deadline - time.monotonic()))


def make_pipeline(
    config,
    workdir: str,
    *,
    split: str = "train",
    process_index: int | None = None,
    process_count: int | None = None,
    cache: CacheBudget | None = None,
) -> Pipeline:
    """This host's pipeline; each stage visited once: the run's tokenizer
    (tokenizer/configured.py), its token store (store/configured.py), the plans and corruption
    the pipeline applies per batch. ``cache``: the bound its sharded stores' block caches share
    (None: a new one, this process's share of config.data.store_cache_bytes)."""

    data_config.validate(config)
    retry.configure(config.get("storage_retry_seconds", retry.BUDGET_S))
    if corpus_pin.uses_hub(config.data):  # at the commits recorded in the workdir
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
        hub.USER_AGENT["bertjax-process"] = f"{process_index}/{process_count}"
        config = corpus_pin.pinned_config(config, workdir, process_index)
    c = config.data
    if c.mixture:
        from bertjax.data.mixture import Mixture

        parts = []
        for url, _ in c.mixture:
            part = config.copy_and_resolve_references()
            part.data.store, part.data.mixture, part.data.mixture_changes = url, (), ()
            part.data.lane_rows = 0  # a store's rows of a step do not start at B * step
            parts.append(make_pipeline(part, workdir, split=split, process_index=process_index,
                                       process_count=process_count, cache=cache))  # fmt: skip
            cache = parts[0].cache  # the stores of a mixture share one bound
        index, count = parts[0].process_index, parts[0].process_count
        return Mixture(config, parts, process_index=index, process_count=count)
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    host_rows(config.batch_size, process_index, process_count)  # fails early, before any work
    if c.stream:  # no store: each process reads its rows' files (bertjax/data/stream/)
        from bertjax.data.stream.source import StreamPipeline

        return StreamPipeline(config, workdir, process_index, process_count)
    per_host = config.batch_size // process_count
    if c.store:  # a sharded store: nothing is tokenized, each host reads its rows' bytes
        from bertjax.data.store.shard_format import read_manifest
        from bertjax.data.store.shard_reader import ShardedStore

        manifest = read_manifest(c.store)  # once: a line a shard, read and parsed on every host
        tokenizer = store_config.store_tokenizer(config, manifest)
        # Opened from the manifest alone: token_windows rows are computed by index, the
        # sentence plans read the index of the pieces their rows fall in (piece_plans.py).
        store, eval_store = (
            ShardedStore(c.store, s, tokenizer, index=False, manifest=manifest)
            for s in (split, "eval")
        )
        reads = read_settings.choose(
            c, sharded=True, host_rows=per_host, block_bytes=store.blocks.block_bytes
        )
        cache = cache or CacheBudget(reads.process_cache_bytes)
        for opened in (store, eval_store):
            opened.set_reads(cache, reads.read_threads, reads.read_gap_bytes)
    else:
        tokenizer = load_tokenizer(config, workdir, process_index, process_count)
        store, eval_store = store_config.load_store(config, tokenizer, split)
        reads = read_settings.choose(c, sharded=False, host_rows=per_host)
    read_settings.log_choice(c.store or store.directory, reads, c, sharded=bool(c.store))
    if store.num_documents == 0:
        raise ValueError(
            f"store {store.directory!r} has no {split!r} documents "
            f"(heldout_fraction={c.heldout_fraction}); "
            "use a bigger corpus or change config.data.heldout_fraction"
        )
    similar = similarity.load(c.similar_words_file, tokenizer) if c.correction else None
    pipeline = Pipeline(
        config,
        tokenizer,
        store,
        process_index=process_index,
        process_count=process_count,
        similar=similar,
        eval_store=eval_store if eval_store.num_documents else None,
        reads=reads,
        cache=cache,
    )
    if c.workers:
        pipeline.start_workers(workdir)
    return pipeline
