"""Sample plans: which token ranges of the store form each sample, a pure function of (config, seed,
epoch).

A plan lists, per sample, segment A = tokens[a_start:a_end), segment B = tokens[b_start:b_end)
(empty for single-segment objectives) and a sentence label. Label convention, as Hugging Face's
`next_sentence_label` / `sentence_order_label`: 0 = B is the real continuation of A in order,
1 = B is a random segment (NSP) or A and B are swapped (SOP); always 0 without sentence pairs.

- nsp: BERT's create_pretraining_data (google-research/bert create_pretraining_data.py,
  create_instances_from_document), per document: target length max_len - 3 (with probability
  short_seq_prob a random target in [2, max]); sentences accumulate into a chunk until the target is
  reached; A = first 1..n-1 sentences of the chunk; B comes from a random *other* document
  (resampled until it differs; in a store or piece of one document, that document, as BERT
  after its ten draws), starting at a random sentence, and the unused sentences go back;
  otherwise B is the rest of the chunk; the longer of A/B is cut one token at a time from the front
  or back at random (drawn in closed form: same distribution). A lone sentence that reaches the
  target gets a random B (label 1), as BERT does. Deviations, to keep labels at 50%: each such pair
  owes half a random label, which the following chunks of two or more sentences pay back by drawing
  a random B with probability 1/2 - a (a = min(1/2, owed); BERT: always 1/2), so labels are 50%
  random in expectation (with short targets, short_seq_prob, many chunks are one sentence, which in
  BERT pushes labels towards random); and a one-sentence document or a short one-sentence chunk (a
  document's last sentence) gives no sample (counted as `single_sentence_documents` /
  `one_sentence_chunks`; such sentences can still be a random B), where BERT pairs them with a
  random B too.
- sop: ALBERT's sentence order: A, B consecutive segments of one document; swapped with probability
  1/2. A chunk needs two sentences; a trailing one-sentence chunk is dropped (counted).
- pairs: sop's consecutive A, B, never swapped and without a label: `[CLS] A [SEP] B [SEP]` rows
  with B's segment embedding for an objective with no sentence task (PERT, whose README figure
  shows this input).
- full_sentences / doc_sentences (RoBERTa): contiguous sentences packed up to max_len - 2 tokens,
  crossing documents with the stored [SEP] between them, or not crossing them; a sentence longer
  than the budget is cut into consecutive full rows and its rest starts the next row.
- mlm: doc_sentences with BERT's short-sequence randomness (per document target).
- token_windows: the token stream cut into windows of max_len - 2 tokens, crossing sentences and
  documents (the stored [SEP] between them stays, unmaskable), as Megatron-LM's and MaxText's
  pretraining rows; each epoch shifts the cut points by a keyed offset in [0, max_len - 2). A row
  is computed from its index alone (`TokenWindows`), so the plan needs only the store's token
  count. The other plans walk every sentence of the store they are given: the pipeline gives
  them one piece of the store at a time (piece_plans.py), so every plan starts from a sharded
  store's manifest, whatever its size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data.store.memmap import Store


@dataclasses.dataclass
class Plan:
    """Token ranges and labels of every sample of one epoch at one sequence length."""

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    label: np.ndarray
    skipped: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.a_start)

    def lengths(self) -> np.ndarray:
        """Row length of each sample with [CLS] and one [SEP] per segment."""
        b = self.b_end - self.b_start
        return (self.a_end - self.a_start) + b + 2 + (b > 0)


class _Uniforms:
    """Uniform floats drawn in bulk from a generator, handed out one at a time (fast in loops)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16):
        self.rng, self.block, self.values, self.i = rng, block, [], 0

    def __call__(self) -> float:
        if self.i >= len(self.values):
            self.values, self.i = self.rng.random(self.block).tolist(), 0
        self.i += 1
        return self.values[self.i - 1]

    def randint(self, low: int, high: int) -> int:
        """Integer in [low, high], both inclusive (as Python's random.randint)."""
        return low + int(self() * (high - low + 1))


def _truncate(plan_cols, max_tokens: int, rng: np.random.Generator):
    """Cuts the longer of A/B one token at a time (front or back at random) until A+B fits."""
    a0, a1, b0, b1 = plan_cols
    la, lb = a1 - a0, b1 - b0
    excess = np.maximum(la + lb - max_tokens, 0)
    diff = np.abs(la - lb)
    # The longer side loses tokens until both are equal, then they alternate (B first on ties).
    shared = np.maximum(excess - diff, 0)
    longer_cut = np.minimum(excess, diff)
    cut_a = np.where(la > lb, longer_cut, 0) + shared // 2
    cut_b = np.where(la > lb, 0, longer_cut) + (shared + 1) // 2
    front_a = rng.binomial(cut_a, 0.5)
    front_b = rng.binomial(cut_b, 0.5)
    return a0 + front_a, a1 - (cut_a - front_a), b0 + front_b, b1 - (cut_b - front_b)


def _target(u: _Uniforms, max_tokens: int, short_seq_prob: float) -> int:
    return u.randint(2, max_tokens) if u() < short_seq_prob else max_tokens


class _PairSampler:
    """Walks one epoch's documents into NSP/SOP pairs (see the module docstring)."""

    def __init__(self, store: Store, max_tokens: int, short_seq_prob: float, rng, objective: str):
        self.begin = store.sentences[:, 0].tolist()
        self.end = store.sentences[:, 1].tolist()
        self.docs = store.documents.tolist()
        self.max_tokens, self.short_seq_prob = max_tokens, short_seq_prob
        self.nsp, self.sop = objective == "nsp", objective in ("sop", "pairs")
        self.u = _Uniforms(rng)
        self.rows: list[tuple] = []  # (a_start, a_end, b_start, b_end, label)
        self.single = self.dropped = 0
        self.lone, self.owed = 0, 0.0  # lone-sentence pairs (random B); random labels they owe

    def document(self, doc: int) -> None:
        """Appends the pairs of one document: its sentences accumulate into chunks."""
        first, last = self.docs[doc], self.docs[doc + 1]
        if last - first < 2:
            self.single += 1
            return
        target = _target(self.u, self.max_tokens, self.short_seq_prob)
        start, i, length = first, first, 0
        while i < last:
            length += self.end[i] - self.begin[i]
            n = i - start + 1
            if self._chunk_ends(i == last - 1, n, length, target):
                if n == 1 and length < target:
                    self.dropped += 1  # a short one-sentence chunk (a document's last sentence)
                else:
                    i = self._pair(doc, start, i, n, target)
                start, length = i + 1, 0
            i += 1

    def _chunk_ends(self, last_sentence: bool, n: int, length: int, target: int) -> bool:
        if self.sop and n < 2:  # SOP needs two sentences; a trailing single one is dropped
            self.dropped += last_sentence
            return False
        return last_sentence or length >= target

    def _pair(self, doc: int, start: int, i: int, n: int, target: int) -> int:
        """Appends the pair of chunk start..i; returns the last sentence the pair used."""
        u, begin, end = self.u, self.begin, self.end
        a_end = start + (u.randint(1, n - 1) if n >= 2 else 1)
        if n == 1:  # a lone sentence that reaches the target: always a random next segment
            random_next = True
            self.lone += 1
            self.owed += 0.5
        else:
            random_next = self.nsp and u() < self._random_next_probability()
        label = 0
        if random_next:
            label = 1
            b_start, b_end = self._random_segment(doc, target - (end[a_end - 1] - begin[start]))
            i = a_end - 1  # unused sentences are put back
        else:
            b_start, b_end = begin[a_end], end[i]
        self.rows.append((begin[start], end[a_end - 1], b_start, b_end, label))
        return i

    def _random_next_probability(self) -> float:
        """P(random next) for a chunk of two or more sentences: 1/2 as BERT, lowered by what is
        still owed: each lone-sentence pair (always random) owes 1/2 a random label, paid back by
        the following chunks (at most 1/2 each), so labels are 50% random in expectation."""
        paid = min(0.5, self.owed)
        self.owed -= paid
        return 0.5 - paid

    def _random_segment(self, doc: int, target: int) -> tuple[int, int]:
        """Sentences of another document, from a random one on, until ``target`` tokens; in a
        store (a piece) of one document, of that document: BERT's ten draws of another document
        all draw it, and BERT then takes its random segment from it."""
        u, docs = self.u, self.docs
        other = doc  # one document: it is the only one to draw
        while other == doc and len(docs) > 2:
            other = u.randint(0, len(docs) - 2)
        j = u.randint(docs[other], docs[other + 1] - 1)
        b_start = self.begin[j]
        while j < docs[other + 1] - 1 and self.end[j] - b_start < target:
            j += 1
        return b_start, self.end[j]


def pair_plan(
    store: Store,
    max_seq_length: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    objective: str,
) -> Plan:
    """NSP (BERT), SOP (ALBERT) or unlabelled consecutive ("pairs") sentence pairs of every
    document, in document order."""
    if objective not in ("nsp", "sop", "pairs"):
        raise ValueError(f"objective={objective!r} is not a sentence-pair objective")
    num_docs = store.num_documents
    if objective == "nsp" and num_docs < 1:
        raise ValueError(
            f"store {store.directory!r} ({store.split}) has no document: NSP needs one to draw "
            "sentence pairs from"
        )
    max_tokens = max_seq_length - 3
    sampler = _PairSampler(store, max_tokens, short_seq_prob, rng, objective)
    for doc in range(num_docs):
        sampler.document(doc)
    columns = np.asarray(sampler.rows, np.int64).reshape(-1, 5).T
    a0, a1, b0, b1 = _truncate(tuple(columns[:4]), max_tokens, rng)
    label = columns[4].astype(np.int32)
    if objective == "sop":
        swap = rng.random(len(a0)) < 0.5
        a0, a1, b0, b1 = (
            np.where(swap, b0, a0),
            np.where(swap, b1, a1),
            np.where(swap, a0, b0),
            np.where(swap, a1, b1),
        )
        label = swap.astype(np.int32)
    skipped = {"single_sentence_documents": sampler.single, "one_sentence_chunks": sampler.dropped}
    return Plan(a0, a1, b0, b1, label, skipped)


def packed_plan(
    store: Store,
    max_seq_length: int,
    *,
    cross_documents: bool,
    short_seq_prob: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Plan:
    """RoBERTa FULL-SENTENCES (cross_documents) / DOC-SENTENCES rows of whole sentences."""
    budget = max_seq_length - 2
    sent_begin = store.sentences[:, 0].tolist()
    sent_end = store.sentences[:, 1].tolist()
    docs = store.documents.tolist()
    u = _Uniforms(rng) if rng is not None else None
    starts, ends = [], []
    cur_start = cur_end = -1
    limit = budget
    for doc in range(len(docs) - 1):
        if u is not None and short_seq_prob > 0:
            limit = _target(u, budget, short_seq_prob)
        for k in range(docs[doc], docs[doc + 1]):
            b, e = sent_begin[k], sent_end[k]
            if cur_start >= 0 and e - cur_start <= limit:
                cur_end = e  # fits, with the document [SEP] in between when crossing documents
                continue
            if cur_start >= 0:
                starts.append(cur_start)
                ends.append(cur_end)
                cur_start = -1
            while e - b > limit:  # a sentence longer than the row: full pieces, the rest stays open
                starts.append(b)
                ends.append(b + limit)
                b += limit
            cur_start, cur_end = b, e
        if not cross_documents and cur_start >= 0:
            starts.append(cur_start)
            ends.append(cur_end)
            cur_start = -1
    if cur_start >= 0:
        starts.append(cur_start)
        ends.append(cur_end)
    a0, a1 = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    zeros = np.zeros(len(a0), np.int64)
    return Plan(a0, a1, zeros, zeros, zeros.astype(np.int32))


class _Windows:
    """One column of `TokenWindows`: value(row) = row * width + offset + shift, by index."""

    def __init__(self, n: int, width: int, shift: int, scale: int = 1):
        self.n, self.width, self.shift, self.scale = n, width, shift, scale

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows) -> np.ndarray:
        return np.asarray(rows, np.int64) * self.width * self.scale + self.shift


class TokenWindows:
    """The token_windows plan of one epoch: row r = tokens [shift + r w, shift + (r + 1) w) with
    w = max_seq_length - 2; no B segment, label 0. Columns are computed per asked-for row, in
    O(1) memory (the Plan interface: a_start, a_end, b_start, b_end, label, skipped)."""

    def __init__(self, num_tokens: int, max_seq_length: int, rng: np.random.Generator):
        width = max_seq_length - 2
        shift = int(rng.integers(width)) if num_tokens > width else 0
        self.width, self.shift = width, shift
        self.n = max(0, (int(num_tokens) - shift) // width)
        self.a_start = _Windows(self.n, width, shift)
        self.a_end = _Windows(self.n, width, shift + width)
        self.b_start = self.b_end = self.label = _Windows(self.n, 0, 0, scale=0)
        self.skipped = {"tail_tokens": int(num_tokens) - shift - self.n * width}

    def __len__(self) -> int:
        return self.n


def make_plan(
    store: Store,
    objective: str,
    max_seq_length: int,
    short_seq_prob: float,
    rng: np.random.Generator,
) -> Plan | TokenWindows:
    """The plan of one epoch for a sample plan (config.data.sample_plan)."""
    if objective in ("nsp", "sop", "pairs"):
        return pair_plan(store, max_seq_length, short_seq_prob, rng, objective)
    if objective == "full_sentences":
        return packed_plan(store, max_seq_length, cross_documents=True)
    if objective == "doc_sentences":
        return packed_plan(store, max_seq_length, cross_documents=False)
    if objective == "token_windows":
        return TokenWindows(len(store.tokens), max_seq_length, rng)
    if objective == "mlm":
        return packed_plan(
            store, max_seq_length, cross_documents=False, short_seq_prob=short_seq_prob, rng=rng
        )
    raise ValueError(f"unknown sample plan {objective!r}")
