"""The data pipeline: `make_pipeline(config, workdir).batch(step)` = this host's rows of global
batch `step`.

The global batch of a step is a pure function of (config, seed, step): with row length T and
ordinal r of the step among steps of that length (see schedule.py), epoch = r // steps_per_epoch(T)
and the step takes positions (r % steps_per_epoch(T)) * B + [0, B) of that epoch's shuffled plan.
Rows are masked with keys (seed, epoch, step * B + row), so any host/worker/prefetch split and any
restart give the same rows, and each epoch masks differently. The sentence plans are built per
piece of the store and read in a two-level stateless shuffle (piece_plans.py): a host builds only
the pieces its rows fall in, whatever the store's size; an epoch's size is fixed from epoch 0's
plans, and a piece with fewer units in a later epoch wraps around (NSP plans vary per epoch).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Iterator

import numpy as np

from bertjax.data import data_config, keys, workers
from bertjax.data.corruption import causal, masking, similarity
from bertjax.data.plans import piece_plans, rows, samples
from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.data.plans.index_shuffle import IndexShuffle
from bertjax.data.plans.schedule import LengthSchedule
from bertjax.data.source import DataSource, host_rows
from bertjax.data.store import configured as store_config
from bertjax.data.store.memmap import Store
from bertjax.data.tokenizer import Tokenizer
from bertjax.data.tokenizer.configured import load_tokenizer

_CACHE_SIZE = 4  # (length, epoch) plans kept in memory


class _Split:
    """The epochs of one split: token_windows plans (rows by index) cached per (length, epoch);
    the sentence plans per piece (piece_plans.py)."""

    def __init__(self, store: Store, config, batch_size: int, purpose: str):
        self.store, self.c, self.seed, self.batch_size, self.purpose = (
            store,
            config.data,
            config.seed,
            batch_size,
            purpose,
        )
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self.pieces = None
        if self.c.sample_plan != "token_windows":
            self.pieces = piece_plans.PieceSplit(store, self.c, self.seed, purpose)

    def epoch(self, length: int, epoch: int):
        """token_windows: (plan, order, None); a sentence plan: its PiecePlan."""
        if self.pieces is not None:
            return self.pieces.epoch(length, epoch)
        key = (length, epoch)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            c = self.c
            plan_rng = keys.generator(self.seed, epoch, f"{self.purpose}/plan/{length}")
            plan = samples.make_plan(self.store, c.sample_plan, length, c.short_seq_prob, plan_rng)
            purpose = f"{self.purpose}/order/{length}"
            # rows by index: no array the size of the epoch
            key_order = int(keys.row_keys(self.seed, epoch, purpose, np.zeros(1, np.int64))[0])
            self._cache[key] = (plan, IndexShuffle(len(plan), key_order), None)
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
            return self._cache[key]

    def num_units(self, length: int, epoch: int) -> int:
        if self.pieces is not None:
            return len(self.pieces.epoch(length, epoch))
        return len(self.epoch(length, epoch)[1])

    def steps_per_epoch(self, length: int) -> int:
        if length not in self._sizes:
            units = self.num_units(length, 0)
            if units < self.batch_size:
                raise ValueError(
                    f"store {self.store.directory!r} ({self.store.split}) gives {units} rows of "
                    "length "
                    f"{length} per epoch, fewer than the batch size {self.batch_size}: use a "
                    "bigger corpus "
                    "or a smaller config.batch_size"
                )
            self._sizes[length] = units // self.batch_size
        return self._sizes[length]


class Pipeline(DataSource):
    """Deterministic, restartable pretraining batches for one host; see the module docstring."""

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
    ):
        c = self.c = config.data
        self.config, self.tokenizer, self.store = config, tokenizer, store
        self.global_batch_size = config.batch_size
        self.process_index, self.process_count = process_index, process_count
        self._batches = BatchPlan.from_config(config, c.max_seq_length)
        if self._batches.sizes and c.length_schedule:
            raise ValueError(
                "config.batch_warmup with config.data.length_schedule: a growing batch indexes "
                "one length's samples; give each length its own phase (config.phases)"
            )
        for size in {*self._batches.sizes, self._batches.final}:
            host_rows(size, process_index, process_count)  # every size divides over the hosts
        self._split = _Split(
            store, config, config.batch_size, "train" if store.split == "train" else "eval"
        )
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
        self._executor = (
            concurrent.futures.ThreadPoolExecutor(c.prefetch_threads, "bertjax-data")
            if c.prefetch
            else None
        )
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._in_workers = False
        self._futures_lock = threading.Lock()

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

    def _rows(
        self,
        split: _Split,
        length: int,
        first: int,
        count: int,
        key_base: int,
        purpose: str,
    ) -> dict[str, np.ndarray]:
        """Unmasked host rows of the global samples first .. first + count - 1 at ``length``,
        masking keys from global sample index key_base + row (see `sample_rows`)."""
        hosts = host_rows(count, self.process_index, self.process_count)
        host = np.arange(hosts.start, hosts.stop)
        return self.sample_rows(length, first + host, key_base + host, purpose, split)

    def sample_rows(
        self,
        length: int,
        samples: np.ndarray,
        key_index: np.ndarray,
        purpose: str,
        split: _Split | None = None,
    ) -> dict[str, np.ndarray]:
        """Unmasked rows of the given global samples at ``length`` (sample s: epoch s // U,
        position s % U of that epoch's order, U the rows an epoch gives in whole batches of
        config.batch_size), with word_starts/maskable and their masking keys (seed, epoch,
        purpose, key_index); in the order of ``samples``."""
        split = split or self._split
        samples, key_index = np.asarray(samples, np.int64), np.asarray(key_index, np.int64)
        per_epoch = split.steps_per_epoch(length) * self.global_batch_size
        epochs, within = np.divmod(samples, per_epoch)
        order = np.argsort(epochs, kind="stable")  # a batch may straddle two epochs
        parts, row_keys = [], []
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            parts.append(self._epoch_rows(split, length, int(epoch), within[chosen]))
            row_keys.append(keys.row_keys(self.config.seed, int(epoch), purpose, key_index[chosen]))
        out = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        out["row_keys"] = np.concatenate(row_keys)
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return {k: v[back] for k, v in out.items()}

    def _epoch_rows(self, split: _Split, length: int, epoch: int, within: np.ndarray) -> dict:
        """Rows at positions ``within`` of one epoch's order (wrapping around its units)."""
        units = within % split.num_units(length, epoch)
        store, tok = split.store, self.tokenizer
        if split.pieces is None:  # token_windows
            plan, order, _ = split.epoch(length, epoch)
            chosen = order[units]
            cols = tuple(getattr(plan, n)[chosen] for n in ("a_start", "a_end", "b_start", "b_end"))
            out = rows.pair_rows(
                store.tokens, store.word_starts, tok.special, cols, length, self._special_ids
            )
            out["next_sentence_label"] = plan.label[chosen]
            return out
        cols, row_of_sample, offsets = split.epoch(length, epoch).samples(units)
        if not self.c.pack_rows:
            out = rows.pair_rows(
                store.tokens, store.word_starts, tok.special, cols[:4], length, self._special_ids
            )
            out["next_sentence_label"] = cols[4].astype(np.int32)
            return out
        out = rows.packed_rows(
            store.tokens,
            store.word_starts,
            tok.special,
            cols[:4],
            length,
            self._special_ids,
            row_of_sample,
            offsets,
            len(units),
        )
        out["next_sentence_label"] = np.zeros(len(units), np.int32)
        return out

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

    def compute_batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of global batch `step`, computed now (no prefetch)."""
        length, ordinal = self._schedule(step)
        batch = self._batches.batch(step)
        if self._batches.sizes:  # a growing batch: samples consumed (one length, ordinal = step)
            first = key_base = self._batches.samples_before(step)
        else:
            first, key_base = ordinal * batch, step * batch
        return self.mask_rows(self._rows(self._split, length, first, batch, key_base, "mask"))

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This host's rows of global batch `step`; the next `prefetch` steps are computed in the
        background."""
        step = int(step)
        if self._executor is None:
            return self.compute_batch(step)
        with self._futures_lock:
            future = self._futures.pop(step, None)
            for old in [s for s in self._futures if s < step or s > step + self.c.prefetch]:
                self._futures.pop(old).cancel()
            for ahead in range(step + 1, step + 1 + self.c.prefetch):
                if ahead not in self._futures:
                    work = workers.compute_batch if self._in_workers else self.compute_batch
                    self._futures[ahead] = self._executor.submit(work, ahead)
        return future.result() if future is not None else self.compute_batch(step)

    def eval_batches(self, num_batches: int) -> Iterator[dict[str, np.ndarray]]:
        """`num_batches` fixed batches (same every call) of the held-out split at max_seq_length."""
        if self._eval_store is None:
            raise ValueError("this pipeline has no held-out split")
        if self._eval_split is None:
            self._eval_split = _Split(self._eval_store, self.config, self.global_batch_size, "eval")
        for i in range(num_batches):
            first = i * self.global_batch_size
            rows_i = self._rows(
                self._eval_split, self.c.max_seq_length, first, self.global_batch_size, first,
                "eval-mask",
            )  # fmt: skip
            yield self.mask_rows(rows_i, self._eval_mask_spec)

    def start_workers(self, workdir: str) -> None:
        """Prefetched batches computed in config.data.workers processes (data/workers.py)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = workers.process_pool(
            make_pipeline, self.config, workdir, self.process_index, self.process_count
        )
        self._in_workers = True

    def close(self):
        """Stops background prefetching."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def make_pipeline(
    config,
    workdir: str,
    *,
    split: str = "train",
    process_index: int | None = None,
    process_count: int | None = None,
) -> Pipeline:
    """This host's pipeline; each stage visited once: the run's tokenizer
    (tokenizer/configured.py), its token store (store/configured.py), the plans and corruption
    the pipeline applies per batch."""

    data_config.validate(config)
    c = config.data
    if c.mixture:
        from bertjax.data.mixture import Mixture

        parts = []
        for url, _ in c.mixture:
            part = config.copy_and_resolve_references()
            part.data.store, part.data.mixture, part.data.mixture_changes = url, (), ()
            parts.append(make_pipeline(part, workdir, split=split, process_index=process_index,
                                       process_count=process_count))  # fmt: skip
        index, count = parts[0].process_index, parts[0].process_count
        return Mixture(config, parts, process_index=index, process_count=count)
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    host_rows(config.batch_size, process_index, process_count)  # fails early, before any work
    if c.store:  # a sharded store: nothing is tokenized, each host reads its rows' bytes
        from bertjax.data.store.shard_reader import ShardedStore

        tokenizer = store_config.store_tokenizer(config)
        # Opened from the manifest alone: token_windows rows are computed by index, the
        # sentence plans read the index of the pieces their rows fall in (piece_plans.py).
        store, eval_store = (
            ShardedStore(c.store, s, tokenizer, c.store_cache_bytes, index=False)
            for s in (split, "eval")
        )
    else:
        tokenizer = load_tokenizer(config, workdir, process_index, process_count)
        store, eval_store = store_config.load_store(config, tokenizer, split)
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
    )
    if c.workers:
        pipeline.start_workers(workdir)
    return pipeline
