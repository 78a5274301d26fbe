"""`StreamPipeline`: pretraining batches read straight from a corpus's files (config.data.stream),
no store prepared: for Colab and small runs, from local files, a bucket or the Hub.

At the start process 0 lists the corpus (its units: units.py) and finds the document the held-out
rule adds (sentences.forced_heldout), and gives both to the other processes (one broadcast: the
listing requests of a run do not grow with its processes); a tokenizer is the configured one, or
a SentencePiece model process 0 trains on the first SAMPLE_SENTENCES training sentences. Then
every batch is a function of its step (lanes.py): a process builds its rows, reading only the
units of its rows' lanes, tokenizing each unit when a step first needs it. Rows are token windows
(`[CLS] W tokens [SEP]`, as sample_plan="token_windows"), masked as the store's pipeline masks
them, keyed by (seed, epoch, global row). Held-out batches are each lane's held-out documents,
in corpus order, cut into windows (repeated where a lane has fewer than the batches ask)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import threading

import numpy as np

from bertjax import paths, retry
from bertjax.data import data_config, keys
from bertjax.data.corruption import causal, masking
from bertjax.data.plans import rows as rows_lib
from bertjax.data.prefetch import CLOSE_WAIT_S, Prefetch
from bertjax.data.source import DataSource, host_rows
from bertjax.data.store.memmap import encode_chunk
from bertjax.data.stream import counts as counts_lib
from bertjax.data.stream.lanes import LaneStream, lane_count, share_out
from bertjax.data.stream.units import Unit, corpus_units, unit_documents
from bertjax.data.text.sentences import forced_heldout, is_heldout

SAMPLE_SENTENCES = 200_000  # training sentences a tokenizer is trained on when none is given


def corpus_plan(c, batch_size: int, process_index: int) -> dict:
    """The units and the forced held-out document: process 0's, given to every process."""
    import jax

    from bertjax.data.corpus_pin import broadcast

    alone = jax.process_count() == 1
    plan = None
    if process_index == 0 or alone:
        units = corpus_units(c, batch_size)
        docs = (doc_id for unit in units for doc_id, _ in unit_documents(unit, c))
        forced = list(forced_heldout(docs, c.heldout_fraction))
        plan = {"units": [u.as_list() for u in units], "forced": forced}
    return plan if alone else broadcast(plan)


class StreamPipeline(DataSource):
    """This process's rows of each global batch, straight from the corpus's files."""

    def __init__(self, config, workdir: str, process_index: int, process_count: int):
        c = self.c = config.data
        self.config, self.seed = config, int(config.seed)
        self.batch_size = int(config.batch_size)
        self.process_index, self.process_count = process_index, process_count
        self.host = host_rows(self.batch_size, process_index, process_count)
        plan = corpus_plan(c, self.batch_size, process_index)
        self.units = [Unit(*u) for u in plan["units"]]
        self.forced = plan["forced"]
        self.tokenizer = _tokenizer(config, workdir, self, process_index, process_count)
        lanes = lane_count(self.batch_size, len(self.units))
        self.lane_rows = self.batch_size // lanes
        members = share_out([u.size // u.parts for u in self.units], lanes)
        self._eval_tokens: dict[int, tuple] = {}
        self.lanes = [
            LaneStream(lane, members[lane], self.seed, self._train_tokens) for lane in range(lanes)
        ]
        key = counts_lib.key(plan["units"], self.tokenizer.fingerprint(), c.heldout_fraction,
                             self.forced)  # fmt: skip
        self._saved_counts = counts_lib.SavedCounts(workdir, key, process_index, len(self.units))
        known = self._saved_counts.load()
        for stream in self.lanes:
            stream.counts.update({u: known[u] for u in stream.units if u in known})
            stream.counts_from = self._saved_counts.directory
        self.width = int(c.max_seq_length) - 2
        self._special_ids = (self.tokenizer.cls_id, self.tokenizer.sep_id, self.tokenizer.pad_id)
        self._mask_spec = masking.MaskSpec(
            mode=c.masking, rate=c.mask_rate, max_predictions=c.max_predictions,
            mask_token_prob=c.mask_token_prob, random_token_prob=c.random_token_prob,
            ngram_probs=data_config.ngram_probabilities(c), diffusion_eps=c.diffusion_eps,
            permute_prob=c.permute_prob,
        )  # fmt: skip
        self._eval_mask_spec = dataclasses.replace(
            self._mask_spec,
            rate=c.eval_mask_rate or c.mask_rate,
            max_predictions=c.eval_max_predictions or c.max_predictions,
        )
        self._lock = threading.Lock()
        ahead = 2 if c.prefetch < 0 else int(c.prefetch)
        self._prefetch = None
        if ahead:
            threads = concurrent.futures.ThreadPoolExecutor(1, "bertjax-stream")
            self._prefetch = Prefetch(self.compute_batches, threads, ahead, 1)

    @functools.cached_property
    def fingerprint(self) -> str:
        facts = [[u.as_list() for u in self.units], self.tokenizer.fingerprint(),
                 self.c.heldout_fraction, self.forced, self.seed, self.batch_size]  # fmt: skip
        return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]

    def hosted_lanes(self) -> list[int]:
        """The lanes this process's rows fall in."""
        rows = np.arange(self.host.start, self.host.stop)
        return [int(lane) for lane in np.unique(rows // self.lane_rows)]

    def own_units(self) -> set[int]:
        """The units of this process's lanes: all it reads."""
        return {u for lane in self.hosted_lanes() for u in self.lanes[lane].units}

    def units_read(self) -> set[int]:
        """The units this process has read so far."""
        return set(self._eval_tokens)

    def documents(self, unit: int, split: str):
        """The ``split`` documents of a unit."""
        fraction = self.c.heldout_fraction
        for doc_id, doc in unit_documents(self.units[unit], self.c):
            if (split == "eval") == is_heldout(doc_id, fraction, self.forced):
                yield doc

    def _train_tokens(self, unit: int):
        """A unit read once: its training tokens (its held-out ones kept for held-out rows)."""
        docs = {"train": [], "eval": []}
        fraction = self.c.heldout_fraction
        for doc_id, doc in unit_documents(self.units[unit], self.c):
            docs["eval" if is_heldout(doc_id, fraction, self.forced) else "train"].append(doc)
        self._eval_tokens[unit] = self._encode(docs["eval"])
        return self._encode(docs["train"])

    def _encode(self, docs):
        if not docs:
            return np.zeros(0, np.int32), np.zeros(0, np.uint8)
        tokens, starts, *_ = encode_chunk(self.tokenizer, docs)
        return tokens.astype(np.int32), starts

    def _window_rows(self, tokens, starts, begin: np.ndarray, length: int):
        """Unmasked rows `[CLS] tokens[b : b + W] [SEP]` (shorter where the tokens end)."""
        end = np.minimum(begin + self.width, len(tokens))
        cols = (begin, end, end, end)
        special = self.tokenizer.special
        if not len(tokens):  # nothing to read: rows of [CLS] [SEP]
            tokens, starts = np.zeros(1, np.int32), np.zeros(1, np.uint8)
        return rows_lib.pair_rows(tokens, starts, special, cols, length, self._special_ids)

    def compute_batches(self, steps: list[int]) -> list[dict]:
        with self._lock:
            out = [self.compute_batch(int(step)) for step in steps]
            self._saved_counts.save(self._counts)
        return out

    def _counts(self) -> dict[int, int]:
        """The token count of every unit this process knows (its lanes')."""
        return {u: n for stream in self.lanes for u, n in stream.counts.items()}

    def compute_batch(self, step: int) -> dict:
        """This process's rows of global batch ``step``."""
        rows, parts = np.arange(self.host.start, self.host.stop), []
        for lane in np.unique(rows // self.lane_rows):
            mine = rows[rows // self.lane_rows == lane]
            window = step * self.lane_rows + (mine - lane * self.lane_rows)
            start, stop = int(window[0]) * self.width, int(window[-1] + 1) * self.width
            stream = self.lanes[int(lane)]
            tokens, starts = stream.read(start, stop)
            total = stream.total()  # known once a read passed the end of the first epoch
            epochs = window * self.width // total if total else np.zeros_like(window)
            out = self._window_rows(tokens, starts, window * self.width - start, self.width + 2)
            index = step * self.batch_size + mine
            out["row_keys"] = np.empty(len(mine), np.uint64)
            for epoch in np.unique(epochs):  # each pass over a lane masks differently
                chosen = epochs == epoch
                out["row_keys"][chosen] = keys.row_keys(self.seed, int(epoch), "mask",
                                                        index[chosen])  # fmt: skip
            parts.append(out)
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        out["next_sentence_label"] = np.zeros(len(rows), np.int32)
        return self._mask(out, None)

    def batch(self, step: int) -> dict:
        if self._prefetch is None:
            return self.compute_batches([int(step)])[0]
        return self._prefetch.batch(int(step), lambda s: self.compute_batches([s])[0])

    def eval_batches(self, num_batches: int):
        """Fixed held-out batches: each lane's held-out tokens in corpus order, in windows. A
        lane reads its units in corpus order only until its held-out tokens fill the windows
        ``num_batches`` batches take (the same windows as from all of its held-out tokens; a
        lane with fewer reads them all and repeats them)."""
        if self.c.heldout_fraction <= 0:
            raise ValueError(
                f"config.data.heldout_fraction={self.c.heldout_fraction}: the stream keeps no "
                "held-out documents: set config.eval_every=0, or a heldout_fraction > 0"
            )
        rows = np.arange(self.host.start, self.host.stop)
        needed = max(1, num_batches) * self.lane_rows * self.width  # tokens a lane's windows take
        held = {}
        with self._lock:
            for lane in np.unique(rows // self.lane_rows):
                got, have = [], 0
                for unit in self.lanes[int(lane)].units:
                    if unit not in self._eval_tokens:
                        self._train_tokens(unit)
                    got.append(self._eval_tokens[unit])
                    have += len(got[-1][0])
                    if have >= needed:
                        break
                held[int(lane)] = tuple(np.concatenate([g[i] for g in got]) for i in (0, 1))
        for i in range(max(1, num_batches)):
            parts = []
            for lane, (tokens, starts) in held.items():
                mine = rows[rows // self.lane_rows == lane]
                count = max(1, -(-len(tokens) // self.width))
                window = (i * self.lane_rows + mine - lane * self.lane_rows) % count
                parts.append(self._window_rows(tokens, starts, window * self.width,
                                               self.width + 2))  # fmt: skip
            out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            out["next_sentence_label"] = np.zeros(len(rows), np.int32)
            out["row_keys"] = keys.row_keys(self.seed, 0, "eval-mask", i * self.batch_size + rows)
            yield self._mask(out, self._eval_mask_spec)

    def _mask(self, out: dict, spec) -> dict:
        """Masked rows (held-out ones: ``spec``), as the store's pipeline masks them."""
        c, tok = self.c, self.tokenizer
        if c.masking == "causal":
            rate = 0.0 if spec is not None else float(c.input_mask_rate)
            masked = causal.causal_batch(out["input_ids"], out["attention_mask"], out["maskable"],
                                         out["row_keys"], rate, tok.mask_id)  # fmt: skip
        else:
            masked = masking.mask_batch(
                out["input_ids"], out["maskable"], out["word_starts"], out["row_keys"],
                spec or self._mask_spec, mask_id=tok.mask_id, normal_ids=tok.normal_ids,
            )  # fmt: skip
        batch = {k: out[k] for k in ("token_type_ids", "attention_mask")}
        batch["input_ids"] = masked["input_ids"]
        targets = ("target_positions",) if "target_positions" in masked else ("masked_ids",)
        for key in ("masked_positions", *targets, "masked_weights"):
            batch[key] = masked[key]
        batch["next_sentence_label"] = out["next_sentence_label"]
        batch["mask_ratio"] = masked["mask_ratio"]
        return batch

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        # the counts, unless the run was told to stop or a read hangs (a stop, and a close, do
        # not wait on storage)
        if not retry.current().cancelled() and self._lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                self._saved_counts.save(self._counts, now=True)
            finally:
                self._lock.release()


def _tokenizer(config, workdir: str, pipeline: StreamPipeline, index: int, count: int):
    """The configured tokenizer, else one trained on the stream's first training sentences."""
    from bertjax.data.tokenizer import Tokenizer
    from bertjax.data.tokenizer.configured import load_tokenizer, workdir_tokenizer

    c = config.data
    if c.hf_vocab or c.tokenizer_model:
        return load_tokenizer(config, workdir, index, count)

    def sentences():
        taken = 0
        for unit in range(len(pipeline.units)):
            for doc in pipeline.documents(unit, "train"):
                for sentence in doc:
                    yield sentence
                    taken += 1
                    if taken >= SAMPLE_SENTENCES:
                        return

    path = workdir_tokenizer(
        sentences, workdir, paths.cache_dir(c.cache_dir), index, count, vocab_size=c.vocab_size,
        model_type=c.tokenizer_type, language=c.language, seed=config.seed,
    )  # fmt: skip
    return Tokenizer(path, language=c.language)
