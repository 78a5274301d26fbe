"""PERT's permuted language model (Cui, Yang & Liu 2022, arXiv 2203.06906; ymcui/PERT): the input
keeps every token, a share of the selected ones trade places, and the model points at positions.

The paper (§3.2): tokens are selected with whole-word and n-gram masking (1-4 words at
40/30/20/10%) for 15% of the input; of those, 90% are shuffled among themselves (only among them,
not over the whole input), the other 10% stay in place as negative samples; there is no [MASK]
token and no sentence-level task. The target at each selected position i is the position of
the original token: where the token that belongs at i sits in the shuffled input (ymcui/PERT
README: "位置2（明）→位置3（表）": position 2, holding 明, points at position 3, which holds 表,
the token originally at 2), so gathering the input at the targets restores the text. A kept
token points at itself. The prediction space is the row's positions, not the vocabulary.
"""

from __future__ import annotations

import numpy as np

from bertjax.data import keys as keys_lib


def permute(
    input_ids: np.ndarray,
    positions: np.ndarray,
    valid: np.ndarray,
    row_keys: np.ndarray,
    permute_prob: float,
    streams: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffles a share of each row's selected positions: (new input_ids [B,T], targets [B,P]).

    positions/valid ([B,P]): the selected positions of each row (ascending) and which slots are
    real; each selected position joins the shuffle with probability `permute_prob` (a hash of the
    row key and the position, stream `streams[0]`), and the shuffled ones are put in the order of
    a second hash (stream `streams[1]`). targets[b, p]: the position in the new row of the token
    that was at positions[b, p] (positions[b, p] itself when it was not shuffled); 0 in padding
    slots.
    """
    batch, slots = positions.shape
    keep_stream, order_stream = streams
    shuffled = valid & (keys_lib.uniform_at(row_keys, positions, keep_stream) < permute_prob)
    count = shuffled.sum(1)
    # The shuffled slots in ascending order (the places) and in a random order (the tokens).
    slot = np.broadcast_to(np.arange(slots), (batch, slots))
    places = np.argsort(np.where(shuffled, slot, slots), 1, kind="stable")
    draw = keys_lib.uniform_at(row_keys, positions, order_stream)
    tokens = np.argsort(np.where(shuffled, draw, 2.0), 1, kind="stable")
    used = np.arange(slots)[None, :] < count[:, None]
    rows = np.broadcast_to(np.arange(batch)[:, None], (batch, slots))[used]
    place_pos = np.take_along_axis(positions, places, 1)[used]
    token_pos = np.take_along_axis(positions, tokens, 1)[used]
    new_ids = input_ids.copy()
    new_ids[rows, place_pos] = input_ids[rows, token_pos]  # the token from token_pos moves ...
    moved_to = np.where(valid, positions, 0).astype(np.int32)
    moved_to[rows, tokens[used]] = place_pos  # ... to place_pos: the target of its old position
    return new_ids, moved_to
