"""Masking for MLM, vectorized over the batch: token, whole-word, n-gram (ALBERT/MacBERT), MacBERT
correction, diffusion.

Every random number of a row is a hash of that row's key (seed, epoch, global sample index) and the
column, so a row masks the same way whatever batch, host or worker it lands in.
- Budget: k = min(max_predictions, max(1, round(mask_rate * n)), n), n = maskable tokens of the row
  (real tokens that are not [CLS]/[SEP]/[PAD]/other specials; those are never masked).
- token: k positions uniformly at random; with token weights (DistilBERT's `mlm_smoothing`: weight
  max(count, 1)^-0.7 from the corpus' token counts, 0 for specials) k positions drawn without
  replacement with probability proportional to their token's weight. Deviation from HF's
  distiller, which draws ceil(0.15 * tokens) positions per *batch*: the draw is per row with the
  row's budget k (rows keep P slots and stay a pure function of their key).
- whole_word: units are whole words, taken in random order; a word that would exceed the budget is
  skipped (no word is ever partly masked), as BERT's whole-word masking.
- ngram: each segment's words are cut into consecutive spans of n words, n drawn per span with
  `ngram_probs` (ALBERT 1/n, MacBERT 40/30/20/10%); spans are taken in random order while the
  tokens before them are under a threshold drawn to make the expected total k, and a row over
  max_predictions drops spans in a second random order: no decision looks at a span's own length,
  so the masked spans keep the configured length distribution. The distribution takes precedence
  over filling the budget exactly: a row may predict a few tokens fewer than k, never more than
  max_predictions (see `_select_units`).
- Each chosen token: [MASK] with mask_token_prob, a random non-special token with random_token_prob,
  else unchanged (BERT's 80/10/10, per token also under whole-word masking, as BERT's code).
- MacBERT correction (a similarity table given): one 80/10/10 decision per selected *word*: the
  whole word becomes ONE of its listed similar words (same number of pieces; a random word when it
  has none), or a random word, or stays (`_correct_words`, bertjax/data/corruption/similarity.py).
- pert (PERT's permuted LM, bertjax/data/corruption/permutation.py): n-gram selection as above, then
  a share permute_prob (0.9) of the selected tokens is shuffled among themselves, the rest stay; no
  [MASK]; `target_positions` [B,P] says where each selected position's original token now is.
- diffusion (LLaDA): t ~ U(eps, 1) per row, each maskable token becomes [MASK] with probability t;
  all masked positions are listed (max_predictions = row width) and t is returned as mask_ratio.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data import keys as keys_lib
from bertjax.data.corruption import permutation
from bertjax.data.corruption.similarity import SimilarWords

# Streams of the per-row hash, one per kind of decision.
_PRIORITY, _ACTION, _RANDOM_ID, _NGRAM, _DIFFUSION, _SIMILAR, _THRESHOLD, _DROP = range(8)
_RANDOM_WORD, _WEIGHT, _PERMUTE, _KEEP_ORDER = range(8, 12)


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """What to mask and how; built from config.data by the pipeline."""

    mode: str = "token"
    rate: float = 0.15
    max_predictions: int = 20
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    ngram_probs: tuple[float, ...] = (1.0,)
    diffusion_eps: float = 1e-3
    permute_prob: float = 0.9  # pert: share of the selected tokens that are shuffled


def smoothed_unigram_weights(counts: np.ndarray, special: np.ndarray, exponent: float):
    """[V] float64 weight of each token for masking: max(count, 1) ** -exponent, 0 for special
    tokens, as DistilBERT's training script (HF distillation train.py, `mlm_smoothing` = 0.7)."""
    weights = np.maximum(np.asarray(counts, np.float64), 1.0) ** -float(exponent)
    weights[np.asarray(special, bool)] = 0.0
    return weights


def budget(maskable: np.ndarray, spec: MaskSpec) -> np.ndarray:
    """Tokens to predict per row: min(P, max(1, round(rate * n)), n)."""
    n = maskable.sum(1)
    return np.minimum(
        np.minimum(spec.max_predictions, np.maximum(1, np.rint(spec.rate * n))), n
    ).astype(np.int64)


def _word_starts(maskable: np.ndarray, word_starts: np.ndarray) -> np.ndarray:
    """Word starts restricted to maskable tokens; a maskable token after a special one starts a
    word."""
    after_special = np.ones_like(maskable)
    after_special[:, 1:] = ~maskable[:, :-1]
    return maskable & (word_starts | after_special)


def _ngram_units(maskable, starts, row_keys, probs) -> tuple[np.ndarray, np.ndarray]:
    """Splits each row's words into consecutive spans of n words: (span starts [B,T], words per
    span)."""
    batch, width = maskable.shape
    num_words = starts.sum(1)
    max_words = int(num_words.max(initial=0))
    # Word-level arrays [B, max_words]: start position, segment run, sampled n.
    rows, cols = np.nonzero(starts)
    word_index = np.cumsum(starts, 1)[rows, cols] - 1
    position = np.zeros((batch, max_words), np.int64)
    position[rows, word_index] = cols
    run_start = maskable & ~np.concatenate([np.zeros((batch, 1), bool), maskable[:, :-1]], 1)
    run = np.cumsum(run_start, 1)
    word_run = np.full((batch, max_words), width + 1, np.int64)
    word_run[rows, word_index] = run[rows, cols]
    # First word of the next run: number of words whose run is <= this word's run.
    per_run = np.zeros((batch, width + 2), np.int64)
    np.add.at(per_run, (rows, run[rows, cols]), 1)
    run_end = np.take_along_axis(np.cumsum(per_run, 1), np.minimum(word_run, width + 1), 1)
    draw = keys_lib.uniform(row_keys, width, _NGRAM)[rows, cols]
    n_of_word = np.zeros((batch, max_words), np.int64)
    n_of_word[rows, word_index] = 1 + np.searchsorted(np.cumsum(probs)[:-1], draw, side="right")
    span_words = np.zeros((batch, max_words + 1), np.int64)
    current = np.zeros(batch, np.int64)
    all_rows = np.arange(batch)
    active = current < num_words
    while active.any():
        r, c = all_rows[active], current[active]
        nxt = np.minimum(c + n_of_word[r, c], run_end[r, c])
        span_words[r, c] = nxt - c
        current[active] = nxt
        active = current < num_words
    unit_start = np.zeros((batch, width), bool)
    words_at = np.zeros((batch, width), np.int64)
    is_span = span_words[rows, word_index] > 0
    unit_start[rows[is_span], cols[is_span]] = True
    words_at[rows[is_span], cols[is_span]] = span_words[rows, word_index][is_span]
    return unit_start, words_at


def _select_units(
    maskable, unit_start, row_keys, k, max_predictions: int, exact: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Units in random order until the budget is spent: (chosen tokens, accepted unit starts).

    exact (whole words, as BERT): a unit that would exceed k is skipped and later ones are tried,
    so a row predicts as close to k as its word lengths allow (never more).
    Otherwise (n-grams) the span distribution takes precedence over filling the budget exactly:
    units are taken in random order while the tokens taken *before* a unit are below a threshold
    drawn so that the expected total is k; whether a unit is taken never depends on its own length,
    so masked spans keep the configured length distribution (ALBERT's exact budget, a skip-and-
    continue fill, favours short spans). A row whose units then exceed max_predictions drops
    accepted units in a second random order (again blind to their lengths) until they fit: a row
    may predict a few tokens fewer than k, never more than max_predictions.
    """
    batch, width = maskable.shape
    unit_id = np.cumsum(unit_start, 1) - 1
    num_units = unit_start.sum(1)
    max_units = int(num_units.max(initial=0))
    rows, cols = np.nonzero(maskable)
    lengths = np.zeros((batch, max_units + 1), np.int64)
    np.add.at(lengths, (rows, unit_id[rows, cols]), 1)
    priority = np.full((batch, max_units + 1), 2.0)
    ur, uc = np.nonzero(unit_start)
    priority[ur, unit_id[ur, uc]] = keys_lib.uniform(row_keys, width, _PRIORITY)[ur, uc]
    order = np.argsort(priority[:, :max_units], 1, kind="stable")
    sorted_len = np.take_along_axis(lengths[:, :max_units], order, 1)
    total = np.cumsum(sorted_len, 1)
    present = np.arange(max_units)[None, :] < num_units[:, None]
    if exact:
        accepted = total <= k[:, None]  # the longest prefix that fits, then skip-and-continue
        first_fail = accepted.sum(1)
        used = (sorted_len * accepted).sum(1)
        for r in range(int(first_fail.min(initial=0)) + 1, max_units):
            if not np.any((used < k) & (r < num_units)):
                break
            take = (r > first_fail) & (r < num_units) & (used + sorted_len[:, r] <= k)
            accepted[:, r] |= take
            used += np.where(take, sorted_len[:, r], 0)
    else:
        # Expected overshoot of a first passage over the threshold with this row's unit lengths L:
        # E[L(L-1)] / (2 E[L]); the threshold is k minus that, randomly rounded.
        mean = (sorted_len * present).sum(1) / np.maximum(num_units, 1)
        mean_sq = (sorted_len**2 * present).sum(1) / np.maximum(num_units, 1)
        overshoot = (mean_sq - mean) / (2 * np.maximum(mean, 1))
        draw = keys_lib.uniform(row_keys, 1, _THRESHOLD)[:, 0]
        threshold = np.maximum(np.floor(k - overshoot + draw), 1)
        accepted = (total - sorted_len < threshold[:, None]) & present
        accepted &= _fit(accepted, sorted_len, max_predictions, row_keys)
    unit_accepted = np.zeros((batch, max_units + 1), bool)
    np.put_along_axis(unit_accepted, order, accepted, 1)
    chosen = np.zeros((batch, width), bool)
    chosen[rows, cols] = unit_accepted[rows, unit_id[rows, cols]]
    return chosen, unit_start & chosen


def _fit(accepted, lengths, max_predictions: int, row_keys) -> np.ndarray:
    """Which accepted units stay [B, U]: rows over max_predictions drop units in a random order
    (a hash of the row key and the unit's slot) until the rest fit."""
    batch, units = accepted.shape
    excess = (lengths * accepted).sum(1) - max_predictions
    drop_priority = np.where(accepted, keys_lib.uniform(row_keys, units, _DROP), 2.0)
    drop_order = np.argsort(drop_priority, 1, kind="stable")
    dropped_len = np.take_along_axis(lengths * accepted, drop_order, 1)
    removed_before = np.cumsum(dropped_len, 1) - dropped_len
    drop_sorted = (removed_before < excess[:, None]) & np.take_along_axis(accepted, drop_order, 1)
    keep = np.ones((batch, units), bool)
    np.put_along_axis(keep, drop_order, ~drop_sorted, 1)
    return keep


def select(
    maskable: np.ndarray,
    word_starts: np.ndarray,
    row_keys: np.ndarray,
    spec: MaskSpec,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions to predict [B,T] bool, words per accepted unit at its start [B,T], ratio [B].

    weights ([B,T], token mode only): the k positions are drawn without replacement with
    probability proportional to their weight (zero: never); None is uniform."""
    batch, width = maskable.shape
    ratio = np.ones(batch, np.float32)
    if spec.mode == "diffusion":
        u = keys_lib.uniform(row_keys, 1, _DIFFUSION)[:, 0]
        ratio = (spec.diffusion_eps + (1.0 - spec.diffusion_eps) * u).astype(np.float32)
        chosen = maskable & (keys_lib.uniform(row_keys, width, _PRIORITY) < ratio[:, None])
        return chosen, chosen.astype(np.int64), ratio
    if weights is not None:
        if spec.mode != "token":
            raise ValueError(f"token weights need token masking, not {spec.mode!r}")
        maskable = maskable & (weights > 0)
    k = budget(maskable, spec)
    if spec.mode == "token":
        u = keys_lib.uniform(row_keys, width, _PRIORITY)
        if weights is None:
            priority = np.where(maskable, u.astype(np.float32), 2.0)
        else:  # exponential keys -log(1-u)/w: the k smallest are a weighted draw without
            # replacement (Efraimidis & Spirakis 2006), the law of torch.multinomial's
            with np.errstate(divide="ignore"):
                priority = np.where(maskable, -np.log1p(-u) / weights, np.inf)
        slots = min(spec.max_predictions, width)
        if slots < width:  # the P smallest priorities, then in order
            candidates = np.argpartition(priority, slots - 1, 1)[:, :slots]
            order = np.take_along_axis(
                candidates, np.argsort(np.take_along_axis(priority, candidates, 1), 1), 1
            )
        else:
            order = np.argsort(priority, 1)
        chosen = np.zeros((batch, width), bool)
        take = np.arange(order.shape[1])[None, :] < k[:, None]
        chosen[np.nonzero(take)[0], order[take]] = True
        return chosen, chosen.astype(np.int64), ratio
    starts = _word_starts(maskable, word_starts.astype(bool))
    if spec.mode == "whole_word":
        unit_start, words = starts, starts.astype(np.int64)
    elif spec.mode in ("ngram", "pert"):
        unit_start, words = _ngram_units(maskable, starts, row_keys, np.asarray(spec.ngram_probs))
    else:
        raise ValueError(f"unknown masking mode {spec.mode!r}")
    chosen, accepted = _select_units(
        maskable, unit_start, row_keys, k, spec.max_predictions, exact=spec.mode == "whole_word"
    )
    return chosen, np.where(accepted, words, 0), ratio


def mask_batch(
    input_ids: np.ndarray,
    maskable: np.ndarray,
    word_starts: np.ndarray,
    row_keys: np.ndarray,
    spec: MaskSpec,
    *,
    mask_id: int,
    normal_ids: np.ndarray,
    similar: SimilarWords | None = None,
    token_weights: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Masks a batch: new input_ids plus masked_positions/ids/weights [B,P] and mask_ratio [B].

    token_weights ([V]): token masking picks positions with probability proportional to their
    token's weight (`smoothed_unigram_weights`: DistilBERT's mlm_smoothing); None: uniform."""
    batch, width = input_ids.shape
    weights = None if token_weights is None else token_weights[input_ids]
    chosen, _, ratio = select(maskable, word_starts, row_keys, spec, weights)
    slots = width if spec.mode == "diffusion" else spec.max_predictions
    count = chosen.sum(1)
    rows, cols = np.nonzero(chosen)  # row-major: each row's positions ascending
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)
    positions = np.zeros((batch, slots), np.int32)
    positions[rows, slot] = cols
    valid = np.arange(slots)[None, :] < count[:, None]
    masked_ids = np.where(valid, np.take_along_axis(input_ids, positions, 1), 0).astype(np.int32)
    new_ids = input_ids.copy()
    extra = {}
    if spec.mode == "diffusion":
        new_ids[chosen] = mask_id
    elif spec.mode == "pert":  # no [MASK]: a share of the selected tokens trade places
        new_ids, extra["target_positions"] = permutation.permute(
            input_ids, positions, valid, row_keys, spec.permute_prob, (_KEEP_ORDER, _PERMUTE)
        )
    elif similar is not None:
        starts = _word_starts(maskable, word_starts.astype(bool))
        new_ids = _correct_words(input_ids, chosen, starts, row_keys, spec, normal_ids, similar)
    else:  # decisions drawn only at the P listed positions (hash of row key and position)
        action = keys_lib.uniform_at(row_keys, positions, _ACTION)
        pick = keys_lib.uniform_at(row_keys, positions, _RANDOM_ID)
        replacement = np.where(
            action < spec.mask_token_prob + spec.random_token_prob,
            normal_ids[(pick * len(normal_ids)).astype(np.int64)],
            masked_ids,
        )
        replacement = np.where(action < spec.mask_token_prob, mask_id, replacement)
        new_ids[rows, cols] = replacement[valid]
    return {
        "input_ids": new_ids,
        "masked_positions": positions,
        "masked_ids": masked_ids,
        "masked_weights": valid.astype(np.float32),
        "mask_ratio": ratio,
        **extra,
    }


def _correct_words(input_ids, chosen, starts, row_keys, spec, normal_ids, similar: SimilarWords):
    """MacBERT's correction, one decision per selected word (drawn at the word's first piece):
    with mask_token_prob the whole word becomes ONE of its listed similar words (a random word when
    it has none), with random_token_prob a random word, else it stays. A random word is a lexicon
    word with as many pieces (random pieces when the lexicon has none of that length)."""
    batch, width = input_ids.shape
    boundary = np.where(starts | ~chosen, np.arange(width)[None, :], width)
    next_boundary = np.minimum.accumulate(boundary[:, ::-1], 1)[:, ::-1]  # first at or after t
    after = np.concatenate([next_boundary[:, 1:], np.full((batch, 1), width)], 1)
    rows, cols = np.nonzero(starts & chosen)  # one entry per selected word
    lengths = after[rows, cols] - cols
    longest = int(lengths.max(initial=1))
    offsets = np.arange(longest)[None, :]
    inside = offsets < lengths[:, None]
    where = np.minimum(cols[:, None] + offsets, width - 1)
    pieces = np.where(inside, input_ids[rows[:, None], where], -1)
    action = keys_lib.uniform_at(row_keys[rows], cols[:, None], _ACTION)[:, 0]
    draw = keys_lib.uniform_at(row_keys[rows], cols[:, None], _SIMILAR)[:, 0]
    synonym, has_similar = similar.choose(similar.lookup(pieces, lengths), draw)
    use_similar = (action < spec.mask_token_prob) & has_similar
    use_random = ~use_similar & (action < spec.mask_token_prob + spec.random_token_prob)
    draw = keys_lib.uniform_at(row_keys[rows], cols[:, None], _RANDOM_WORD)[:, 0]
    lexicon_word, known = similar.random_words(lengths, draw)
    piece_draw = keys_lib.uniform_at(row_keys[rows], where, _RANDOM_ID)
    random_pieces = normal_ids[(piece_draw * len(normal_ids)).astype(np.int64)]
    replacement = np.where(use_random[:, None], random_pieces, pieces)
    lexicon_word = _columns(lexicon_word, longest)
    replacement = np.where((use_random & known)[:, None], lexicon_word, replacement)
    replacement = np.where(use_similar[:, None], _columns(synonym, longest), replacement)
    new_ids = input_ids.copy()
    r, j = np.nonzero(inside)
    new_ids[rows[r], cols[r] + j] = replacement[r, j]
    return new_ids


def _columns(a: np.ndarray, n: int) -> np.ndarray:
    """The first n columns of a, padded with -1."""
    out = np.full((len(a), n), -1, a.dtype)
    out[:, : min(n, a.shape[1])] = a[:, :n]
    return out
