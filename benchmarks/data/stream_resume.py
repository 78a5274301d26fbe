"""What a streamed run (config.data.stream) reads and how long it takes to its first batch when it
resumes mid-epoch, with the workdir's token counts (WORKDIR/stream_counts/) and without them (a
workdir from before they were kept: every unit its lanes read before is read and tokenized
again), beside Hugging Face datasets' streaming resume (`IterableDataset.state_dict()` /
`load_state_dict`) over the same files.

The corpus: Vim's help files on this machine as JSON Lines (a paragraph a document, a file
each), or the built-in corpus. bertjax: batch 16 x 128, a SentencePiece model trained on the
corpus; the run first goes to ``--at`` of its first epoch (counting its units), closes, and a new
pipeline in the same workdir asks for the next step. The peer resumes its iterator at the same
fraction of the documents and takes one example: it tokenizes nothing, so its row is the reading
alone (a lower bound for a pipeline built on it).

  python benchmarks/data/stream_resume.py               # ~1 minute
  python benchmarks/data/stream_resume.py --dry-run     # the built-in corpus, seconds
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time

import slow_store  # noqa: F401  (bertjax of BERTJAX_ROOT first on the path)

from bertjax import trainer
from bertjax.data import make_pipeline
from bertjax.data.text import corpus
from bertjax.data.tokenizer import train_sentencepiece


def write_corpus(kind: str, out: str) -> list[str]:
    """JSON Lines files of paragraphs: one a Vim help file, or 8 of the built-in corpus."""
    os.makedirs(out, exist_ok=True)
    if kind == "vim":
        texts = [open(f, encoding="latin-1").read() for f in sorted(glob.glob(slow_store.VIM_DOCS))]
    else:
        docs = ["\n".join(d) for _, d in corpus.iter_documents("builtin")]
        texts = ["\n\n".join(docs[i::8]) for i in range(8)]
    files = []
    for i, text in enumerate(texts):
        paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
        path = os.path.join(out, f"part-{i:04d}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps({"text": p}) + "\n" for p in paragraphs)
        files.append(path)
    return files


def config_for(files_glob: str, spm: str, batch: int, length: int):
    config = trainer.default_run_config()
    config.batch_size = batch
    config.data.update(corpus=files_glob, corpus_format="jsonl", stream=True,
                       sample_plan="token_windows", max_seq_length=length, tokenizer_model=spm,
                       max_predictions=20, prefetch=0, heldout_fraction=0.01)  # fmt: skip
    return config


def bertjax_rows(config, workdir: str, at: float) -> list[dict]:
    counted = make_pipeline(config, workdir + "-count", process_index=0, process_count=1)
    for lane in counted.lanes:  # every unit tokenized once: the lanes' epoch lengths
        for unit in lane.units:
            lane._count(unit)
    per_step = counted.lane_rows * counted.width
    step = int(at * min(lane.total() for lane in counted.lanes) / per_step)
    counted.close()
    pipeline = make_pipeline(config, workdir, process_index=0, process_count=1)
    pipeline.batch(step - 1)  # the run so far: its lanes' units up to here read and counted
    pipeline.close()  # writes the counts
    units = len(pipeline.units)
    rows = []
    for name in ("counts kept", "no counts (before)"):
        if name.startswith("no"):
            shutil.rmtree(os.path.join(workdir, "stream_counts"))
        start = time.perf_counter()
        resumed = make_pipeline(config, workdir, process_index=0, process_count=1)
        resumed.batch(step)
        took = time.perf_counter() - start
        rows.append({"name": f"bertjax, {name}", "s": took, "read": len(resumed.units_read()),
                     "of": units, "step": step})  # fmt: skip
        resumed.close()
    return rows


def peer_row(files: list[str], at: float) -> dict:
    import datasets

    def stream():
        return datasets.load_dataset("json", data_files=files, split="train", streaming=True)

    total = sum(1 for _ in stream())
    it = iter(ds := stream())
    for _ in range(int(at * total)):
        next(it)
    state = ds.state_dict()
    start = time.perf_counter()
    again = stream()
    again.load_state_dict(state)
    next(iter(again))
    return {"name": f"HF datasets {datasets.__version__} streaming", "s":
            time.perf_counter() - start, "read": "-", "of": len(files), "step": "-"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("vim", "builtin"), default="vim")
    parser.add_argument("--at", type=float, default=0.75, help="where in the first epoch")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--dry-run", action="store_true", help="the built-in corpus, batch 4")
    args = parser.parse_args()
    if args.dry_run:
        args.corpus, args.batch, args.length = "builtin", 4, 64
    with tempfile.TemporaryDirectory() as work:
        files = write_corpus(args.corpus, os.path.join(work, "corpus"))
        with open(files[0]) as f:
            sample = [json.loads(line)["text"] for line in f][:20000]
        spm = train_sentencepiece(iter(sample), os.path.join(work, "spm"), vocab_size=2000)
        config = config_for(os.path.join(work, "corpus", "*.jsonl"), spm, args.batch, args.length)
        rows = bertjax_rows(config, os.path.join(work, "run"), args.at)
        rows.append(peer_row(files, args.at))
    print(f"| resumed at {args.at:.0%} of the first epoch | s to the first batch | units read "
          "| of | step |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['s']:.2f} | {r['read']} | {r['of']} | {r['step']} |")


if __name__ == "__main__":
    main()
