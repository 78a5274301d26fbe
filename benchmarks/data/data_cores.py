"""How many CPU cores a TPU host needs to feed its chips: the data pipeline's CPU per token, beside
what a v5p or v5e host eats for BERT-base and ModernBERT-base at their recipes' row lengths.

Per token, two costs: making batches (locate rows, gather them from the block cache, build and
mask: `compute_batches` in this process, one thread, a warm cache, ``--batch-tokens`` a batch)
and planning (each piece's plan once per epoch: `PieceSplit._build` over --pieces pieces). With
lanes (epoch_order.py) a host plans about the tokens it consumes, so cores = appetite x (CPU per
token of batches + of plans). The store: Vim's help files or the built-in corpus
(benchmarks/data/slow_store.py), local, no latency. A host's appetite: chips x peak bf16 FLOP/s x
MFU / training FLOPs per token (bertjax.training.metrics.train_flops_per_sequence, the recipe's
masked positions).

  python benchmarks/data/data_cores.py                       # the four recipe rows, ~2 minutes
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import slow_store

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.modeling.bert_config import BertConfig
from bertjax.training.metrics import train_flops_per_sequence

# (recipe, model preset, plan, packed, T, masked positions a row): configs/bert_base.py's two
# phases, configs/modernbert_base.py's first two (30% masked)
RECIPES = (
    ("bert_base seq128", "base", "nsp", False, 128, 20),
    ("bert_base seq512", "base", "nsp", False, 512, 76),
    ("modernbert_base pretrain", "modernbert-base", "full_sentences", True, 1024, 307),
    ("modernbert_base extend", "modernbert-base", "full_sentences", True, 8192, 2458),
)
HOSTS = {"v5p": (4, 459e12), "v5e": (4, 197e12)}  # chips a host (VM), peak bf16 FLOP/s a chip


def cpu_per_token(store, spm, work, plan, packed, length, masked, batch_tokens, steps, pieces):
    """(CPU s per token making batches, CPU s per token planning)."""
    config = trainer.default_run_config()
    config.batch_size = rows = max(1, batch_tokens // length)
    config.data.update(store=store, tokenizer_model=spm, sample_plan=plan, pack_rows=packed,
                       max_seq_length=length, max_predictions=masked, prefetch=0)  # fmt: skip
    pipeline = make_pipeline(config, work, process_index=0, process_count=1)
    pipeline.compute_batches(list(range(4)))  # plans built, the cache warm
    pipeline.compute_batches(list(range(4, 4 + steps)))
    cpu = time.process_time()
    pipeline.compute_batches(list(range(4, 4 + steps)))
    batches = (time.process_time() - cpu) / (steps * rows * length)
    split = pipeline._split.pieces
    chosen = list(range(min(pieces, len(split.pieces))))
    split.views(chosen)
    cpu, tokens = time.process_time(), 0
    for piece in chosen:
        split._build(length, 7, piece)  # an epoch no batch used: built here, not kept
        tokens += split.tokens(piece)
    return batches, (time.process_time() - cpu) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mfu", type=float, default=0.55)
    parser.add_argument("--batch-tokens", type=int, default=1 << 15)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--pieces", type=int, default=12)
    parser.add_argument("--corpus", default="vim", choices=("vim", "builtin"))
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "bertjax-bench"))
    args = parser.parse_args()
    _, spm, store = slow_store.prepared_store(args.corpus, args.data_dir, 256 << 10)
    work = tempfile.mkdtemp(prefix="bertjax-cores-")
    print(f"{args.corpus} store, one thread, warm block cache; MFU {args.mfu:.0%}; 4 chips a host")
    print("| recipe | plan | T | batches: M tokens per CPU s | plans: M tokens per CPU s | "
          "M tokens per CPU s, both | v5p host: M tokens/s | cores | v5e host: M tokens/s | "
          "cores |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, preset, plan, packed, length, masked in RECIPES:
        batches, plans = cpu_per_token(store, spm, work, plan, packed, length, masked,
                                       args.batch_tokens, args.steps, args.pieces)  # fmt: skip
        both = batches + plans
        flops = train_flops_per_sequence(BertConfig.preset(preset), length, masked) / length
        cells = []
        for chips, peak in HOSTS.values():
            appetite = chips * peak * args.mfu / flops
            cells += [f"{appetite / 1e6:.2f}", f"{appetite * both:.1f}"]
        name_plan = plan + (" packed" if packed else "")
        print(f"| {name} | {name_plan} | {length} | {1e-6 / batches:.1f} | {1e-6 / plans:.1f} | "
              f"{1e-6 / both:.1f} | " + " | ".join(cells) + " |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
