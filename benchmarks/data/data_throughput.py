"""Data pipeline throughput: masking alone beside Hugging Face's collator, and end to end.

  python benchmarks/data/data_throughput.py  # the tables (builtin corpus, batch 256)
  python benchmarks/data/data_throughput.py --prepare-mb 50  # a ~50 MB corpus: wall time, peak RSS

Everything runs in one process on the CPU. The HF side gets the very same token rows: its collator
is given our rows' ids, special-token masks and offsets that encode our word boundaries, with a
PreTrainedTokenizerFast (WordPiece trained here on the same corpus, same special ids) for its
special tokens; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import time

import ml_collections
import numpy as np

from bertjax.data import default_data_config, keys, make_pipeline
from bertjax.data.corruption import masking
from bertjax.data.store.memmap import prepare_store
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer

MODES = ("token", "whole_word", "ngram", "diffusion")


def _config(
    length: int, mode: str, batch: int, workdir_model: str = ""
) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 0, batch
    config.data = default_data_config()
    config.data.update(
        dict(
            max_seq_length=length,
            max_predictions=20 if length <= 128 else 80,
            masking=mode,
            sample_plan="full_sentences" if mode == "diffusion" else "nsp",
            prefetch=0,
            tokenizer_model=workdir_model,
        )
    )
    return config


def _hf_tokenizer(tok: Tokenizer):
    """A PreTrainedTokenizerFast (WordPiece trained on the builtin corpus) with our special ids and
    size."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    hf = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = tokenizers.normalizers.BertNormalizer()
    hf.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    trainer = tokenizers.trainers.WordPieceTrainer(
        vocab_size=tok.vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    hf.train_from_iterator((s for _, d in corpus.iter_documents("builtin") for s in d), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=hf,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _timed(fn, repeats: int) -> float:
    """Median seconds per call (robust to other load on a shared machine)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _rate(batch: int, seconds: float) -> str:
    return f"{batch / seconds:,.0f}" if seconds == seconds else "n/a"


def masking_table(pipelines, hf_tokenizer, batch: int, repeats: int):
    from transformers import DataCollatorForLanguageModeling

    print(f"\n(1) masking alone, batch {batch}, sequences/s (same token rows on both sides)")
    print(f"{'T':>5} {'mode':<11} {'bertjax':>10} {'HF np':>10} {'HF pt':>10} {'speed-up':>9}")
    for length, p in pipelines.items():
        rows = p._rows(p._split, length, 0, 0, "mask")
        ids, maskable, starts = rows["input_ids"], rows["maskable"], rows["word_starts"]
        # Offsets that give HF our word boundaries: a gap before every word start.
        widths = np.ones_like(ids)
        gaps = np.cumsum(starts | ~maskable, 1)
        begin = np.cumsum(widths, 1) - 1 + gaps
        offsets = np.stack([begin, begin + 1], -1)
        # Full-width rows (padding marked special), so HF needs no ragged padding of offsets.
        examples = [
            {
                "input_ids": ids[i].tolist(),
                "special_tokens_mask": (~maskable[i]).astype(int).tolist(),
                "offset_mapping": offsets[i].tolist(),
            }
            for i in range(batch)
        ]
        plain_examples = [{k: e[k] for k in ("input_ids", "special_tokens_mask")} for e in examples]
        for mode in MODES:
            spec = masking.MaskSpec(
                mode=mode,
                max_predictions=length if mode == "diffusion" else p.c.max_predictions,
                ngram_probs=(6 / 11, 3 / 11, 2 / 11),
            )
            row_keys = keys.row_keys(0, 0, "mask", np.arange(batch))
            mask = functools.partial(
                masking.mask_batch,
                ids,
                maskable,
                starts,
                row_keys,
                spec,
                mask_id=4,
                normal_ids=p.tokenizer.normal_ids,
            )
            ours = _timed(mask, repeats)
            hf_np = hf_pt = float("nan")
            if mode in ("token", "whole_word"):
                wwm = mode == "whole_word"
                data = examples if wwm else plain_examples
                collate_np = DataCollatorForLanguageModeling(
                    hf_tokenizer,
                    whole_word_mask=wwm,
                    return_tensors="np",
                    pad_to_multiple_of=length,
                    seed=0,
                )
                collate_pt = DataCollatorForLanguageModeling(
                    hf_tokenizer,
                    whole_word_mask=wwm,
                    return_tensors="pt",
                    pad_to_multiple_of=length,
                    seed=0,
                )
                hf_np = _timed(functools.partial(collate_np, data), max(1, repeats // 4))
                hf_pt = _timed(functools.partial(collate_pt, data), max(1, repeats // 4))
            best_hf = min(hf_np, hf_pt) if mode in ("token", "whole_word") else float("nan")
            speedup = f"{best_hf / ours:.1f}x" if best_hf == best_hf else "n/a"
            print(
                f"{length:>5} {mode:<11} {_rate(batch, ours):>10} {_rate(batch, hf_np):>10} "
                f"{_rate(batch, hf_pt):>10} "
                f"{speedup:>9}"
            )


def end_to_end_table(workdir: str, model: str, batch: int, steps: int):
    print(
        f"\n(2) end to end (store -> plan -> rows -> masking -> batch), batch {batch}, "
        "sequences/s (median)"
    )
    print(f"{'T':>5} {'plan+masking':<20} {'seq/s':>10} {'ms/batch':>9} {'epoch plan s':>12}")
    for length in (128, 512):
        for mode in MODES:
            p = make_pipeline(
                _config(length, mode, batch, model), workdir, process_index=0, process_count=1
            )
            start = time.perf_counter()
            p.compute_batch(0)  # builds the epoch plan
            plan_s = time.perf_counter() - start
            step = iter(range(1, 10**9))
            per = _timed(lambda p=p, step=step: p.compute_batch(next(step)), steps)
            name = f"{p.c.sample_plan}+{mode}"
            print(f"{length:>5} {name:<20} {batch / per:>10,.0f} {per * 1e3:>9.2f} {plan_s:>12.2f}")


def prefetch_table(workdir: str, model: str, batch: int, steps: int, step_ms: float):
    print(
        f"\n(3) prefetch: a loop that consumes batch(step) then spends {step_ms:.0f} ms on a "
        "device step "
        f"(sleep, GIL released), T=128 nsp+whole_word, batch {batch}"
    )
    for prefetch in (0, 1, 2, 4):
        config = _config(128, "whole_word", batch, model)
        config.data.prefetch = prefetch
        p = make_pipeline(config, workdir, process_index=0, process_count=1)
        p.batch(0)
        start = time.perf_counter()
        for s in range(1, steps + 1):
            p.batch(s)
            time.sleep(step_ms / 1e3)
        per = (time.perf_counter() - start) / steps
        p.close()
        print(
            f"  prefetch={prefetch}: {per * 1e3:6.2f} ms/step (data stall "
            f"{max(per * 1e3 - step_ms, 0):5.2f} ms)"
        )


def prepare_benchmark(megabytes: float, workdir: str, model: str, workers: int):
    """Writes a ~N MB corpus (the builtin corpus, repeated with a numbered prefix) and prepares a
    store."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"corpus_{megabytes:g}mb.txt")
    if not os.path.exists(path):
        docs = [d for _, d in corpus.iter_documents("builtin")]
        written, copy = 0, 0
        with open(path, "w", encoding="utf-8") as f:
            while written < megabytes * 1e6:
                for doc in docs:
                    text = (
                        "\n".join(f"{copy}: {s}" if i == 0 else s for i, s in enumerate(doc))
                        + "\n\n"
                    )
                    written += f.write(text)
                copy += 1
    tok = Tokenizer(model)
    stats = corpus.CorpusStats()
    start = time.perf_counter()
    meta = prepare_store(
        os.path.join(workdir, f"store_{megabytes:g}mb_w{workers}"),
        tok,
        corpus.iter_documents(path, stats=stats),
        heldout_fraction=0.02,
        corpus_description=path,
        stats=stats,
        num_workers=workers,
    )
    wall = time.perf_counter() - start
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    size = os.path.getsize(path) / 1e6
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["eval"]["tokens"]
    print(
        f"prepared {size:.1f} MB ({tokens:,} tokens, {stats.documents:,} documents) with "
        f"num_workers={workers}: "
        f"{wall:.1f} s, {size / wall:.1f} MB/s; peak RSS {peak_self:.0f} MiB (main), "
        f"{peak_children:.0f} MiB "
        "(largest worker)"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/bertjax_data_bench")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prepare-mb", type=float, default=0)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    # The tokenizer (8000-piece unigram on the builtin corpus) and store are prepared once into
    # --workdir.
    base = make_pipeline(
        _config(128, "token", args.batch), args.workdir, process_index=0, process_count=1
    )
    model = base.tokenizer.path
    if args.prepare_mb:
        prepare_benchmark(args.prepare_mb, args.workdir, model, args.workers)
        return
    pipelines = {
        t: make_pipeline(
            _config(t, "token", args.batch, model), args.workdir, process_index=0, process_count=1
        )
        for t in (128, 512)
    }
    masking_table(pipelines, _hf_tokenizer(base.tokenizer), args.batch, args.repeats)
    end_to_end_table(args.workdir, model, args.batch, args.steps)
    prefetch_table(args.workdir, model, args.batch, args.steps, step_ms=10)


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
