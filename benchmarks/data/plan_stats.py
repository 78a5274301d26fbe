"""Per-piece sentence plans against the whole-store plan on the same corpus: what rows no longer
crossing a piece change (bertjax/data/plans/piece_plans.py). The corpus and the statistics are
tests/data_plan_stats_test.py's (the built-in corpus without its ~2% of documents over ~2 k
tokens, four times over: ~1.3 M tokens), at T=128 over 3 epochs; pieces of 2^14 and 2^16 tokens
(the default 2^20 would make this corpus two pieces).

  python benchmarks/data/plan_stats.py
"""

from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import data_plan_stats_test as stats  # noqa: E402

from bertjax.data.store.memmap import Store, prepare_store  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.text import sentences as text  # noqa: E402
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402


def main() -> None:
    work = tempfile.mkdtemp(prefix="bertjax-plan-stats-")
    spm = train_sentencepiece(
        (s for _, d in corpus.iter_documents("builtin") for s in d),
        os.path.join(work, "spm"),
        vocab_size=1000,
    )
    docs = [d for _, d in corpus.iter_documents("builtin") if sum(map(len, d)) < 8000]
    path = os.path.join(work, "corpus.txt")
    with open(path, "w") as f:
        f.write("\n\n".join("\n".join(d) for d in docs * stats.COPIES) + "\n")
    counts = text.CorpusStats()
    tok = Tokenizer(spm)
    documents = corpus.iter_documents(path, stats=counts)
    prepare_store(os.path.join(work, "store"), tok, documents, heldout_fraction=0.0,
                  corpus_description=path, stats=counts)  # fmt: skip
    store = Store(os.path.join(work, "store"), "train", tok)
    print(f"{len(store.tokens):,} tokens, {store.num_documents:,} documents, T={stats.LENGTH}")
    shares = ("0_0.25", "0.25_0.5", "0.5_0.75", "0.75_0.95", "0.95_1.01")
    keys = ("rows", "label_share", "mean_length", "pad_fraction", *(f"length_{s}" for s in shares))
    print("| plan | pieces | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for plan in stats.PLANS:
        whole = stats.whole_store(store, plan)
        print(f"| {plan} | whole store | " + " | ".join(f"{whole[k]:.4g}" for k in keys) + " |")
        for piece_tokens in (1 << 14, 1 << 16):
            split, got = stats.per_piece(store, plan, piece_tokens)
            print(f"| {plan} | {len(split.pieces)} of 2^{piece_tokens.bit_length() - 1} | "
                  + " | ".join(f"{got[k]:.4g}" for k in keys) + " |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
