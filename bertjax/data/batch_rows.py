"""The rows of a batch in three stages: located in their epochs' plans (store positions, nothing
read), read (the rows of several batches in one round of ranges from a sharded store), built
(`[CLS] A [SEP] B [SEP]` rows, packed or not, with word starts and what may be masked)."""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data import keys
from bertjax.data.plans import rows
from bertjax.data.plans.epochs import SplitEpochs
from bertjax.data.source import host_rows


@dataclasses.dataclass
class Located:
    """Rows located in their epochs' plans, not read yet: per epoch, the columns of its samples,
    their labels, the layout of their rows (`rows.pair_layout`: the store positions to read) and
    their packing; the rows' masking keys, and the order back to the rows asked for."""

    split: SplitEpochs
    length: int
    parts: list[dict]
    row_keys: np.ndarray
    back: np.ndarray

    def sources(self) -> list[np.ndarray]:
        return [part["layout"]["source"] for part in self.parts]


class BatchRows:
    """Rows of global samples for one host: what the pipeline (pipeline.py) builds batches of.
    It reads ``config``, ``c`` (config.data), ``global_batch_size``, ``process_index``,
    ``process_count``, ``tokenizer``, ``_special_ids`` and ``_split`` (the training split's
    SplitEpochs) from the pipeline."""

    def _rows(
        self,
        split: SplitEpochs,
        length: int,
        first: int,
        count: int,
        key_base: int,
        purpose: str,
    ) -> Located:
        """Host rows of the global samples first .. first + count - 1 at ``length``, located,
        masking keys from global sample index key_base + row (see `locate_rows`)."""
        hosts = host_rows(count, self.process_index, self.process_count)
        host = np.arange(hosts.start, hosts.stop)
        return self.locate_rows(length, first + host, key_base + host, purpose, split)

    def sample_rows(
        self,
        length: int,
        samples: np.ndarray,
        key_index: np.ndarray,
        purpose: str,
        split: SplitEpochs | None = None,
    ) -> dict[str, np.ndarray]:
        """Unmasked rows of the given global samples at ``length`` (sample s: epoch s // U,
        position s % U of that epoch's order, U the rows an epoch gives in whole batches of
        config.batch_size), with word_starts/maskable and their masking keys (seed, epoch,
        purpose, key_index); in the order of ``samples``."""
        located = self.locate_rows(length, samples, key_index, purpose, split)
        return self.build_rows(located, self.read_rows([located])[0])

    def locate_rows(
        self,
        length: int,
        samples: np.ndarray,
        key_index: np.ndarray,
        purpose: str,
        split: SplitEpochs | None = None,
    ) -> Located:
        """`sample_rows`' rows located in their plans, nothing read yet."""
        split = split or self._split
        samples, key_index = np.asarray(samples, np.int64), np.asarray(key_index, np.int64)
        per_epoch = split.steps_per_epoch(length) * self.global_batch_size
        epochs, within = np.divmod(samples, per_epoch)
        order = np.argsort(epochs, kind="stable")  # a batch may straddle two epochs
        parts, row_keys = [], []
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            parts.append(self._epoch_samples(split, length, int(epoch), within[chosen]))
            row_keys.append(keys.row_keys(self.config.seed, int(epoch), purpose, key_index[chosen]))
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return Located(split, length, parts, np.concatenate(row_keys), back)

    def _epoch_samples(self, split: SplitEpochs, length: int, epoch: int, within) -> dict:
        """The samples at positions ``within`` of one epoch's order (wrapping around its
        units): their columns, labels, row layout and packing."""
        units = within % split.num_units(length, epoch)
        packed = None
        if split.pieces is None:  # token_windows
            plan, order, _ = split.epoch(length, epoch)
            chosen = order[units]
            cols = tuple(getattr(plan, n)[chosen] for n in ("a_start", "a_end", "b_start", "b_end"))
            label = plan.label[chosen]
        else:
            columns, row_of_sample, offsets = split.epoch(length, epoch).samples(units)
            cols, label = columns[:4], columns[4].astype(np.int32)
            if self.c.pack_rows:
                packed, label = (row_of_sample, offsets, len(units)), np.zeros(len(units), np.int32)
        layout = rows.pair_layout(cols, length)
        return {"cols": cols, "label": label, "packed": packed, "layout": layout}

    def read_rows(self, located: list[Located]) -> list[list[tuple]]:
        """The (token ids, word starts) of every part of each of ``located`` (rows of one
        split), read at once: one round of ranges for a sharded store."""
        if not located:
            return []
        store = located[0].split.store
        sources = [source for loc in located for source in loc.sources()]
        gathered = iter(rows.read_sources(store.tokens, store.word_starts, sources))
        return [[next(gathered) for _ in loc.parts] for loc in located]

    def build_rows(self, located: Located, gathered: list[tuple]) -> dict[str, np.ndarray]:
        """Unmasked rows of ``located`` from their read tokens and word starts."""
        store, special = located.split.store, self.tokenizer.special
        parts = []
        for part, got in zip(located.parts, gathered):
            args = (store.tokens, store.word_starts, special, part["cols"], located.length)
            if part["packed"] is None:
                out = rows.pair_rows(*args, self._special_ids, got, part["layout"])
            else:
                out = rows.packed_rows(*args, self._special_ids, *part["packed"], got,
                                       part["layout"])  # fmt: skip
            out["next_sentence_label"] = part["label"]
            parts.append(out)
        out = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        out["row_keys"] = located.row_keys
        return {k: v[located.back] for k, v in out.items()}
