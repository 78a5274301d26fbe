"""Embedding fine-tuning, bertjax against sentence-transformers on the same pairs, start and data
order: held-out NDCG@10 / MRR@10 / Recall@100 (median and range over seeds), the steps/s ratio
in the same run, and what GradCache's larger batch buys at equal steps.

Both sides start from one sentence-transformers directory (``--init``; default: a random
BERT of --width/--layers with a WordPiece vocabulary trained on the training pairs, mean pooling,
Normalize), train on the built-in pairs (bertjax.data.text.pairs; 10% held out by hash) in the same
order (bertjax's epoch permutations keyed by the seed), with MultipleNegativesRankingLoss at the
same scale (bertjax: config.loss.objective="embedding"), batch, steps, AdamW (betas 0.9/0.999,
eps 1e-8, no weight decay, gradient clipping at 1.0), linear warmup then linear decay to 0, and
the same row length for queries and documents. sentence-transformers runs its loss in a plain
torch loop (the optimizer and schedule of its Trainer, without the `datasets` dependency).
Held-out metrics of both models come from one function: each model encodes the held-out queries
and documents, exact cosine search ranks the documents (bertjax.evaluation.retrieval).
steps/s excludes each side's first (compiling) steps.

Run (full):  python benchmarks/comparisons/embed_compare.py --steps=400 --batch_size=32 \
                 --seeds=0,1,2 \
                 --gradcache_batch=128
Run (proof): python benchmarks/comparisons/embed_compare.py --steps=6 --batch_size=8 --seeds=0 \
                 --gradcache_batch=16 --width=32 --layers=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bertjax.data import source
from bertjax.data.text import pairs  # noqa: E402
from bertjax.evaluation import retrieval  # noqa: E402


def build_start(directory: str, train, width: int, layers: int, length: int) -> str:
    """A random BERT with a WordPiece vocabulary of the training pairs, saved by
    sentence-transformers (Transformer, mean Pooling, Normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    raw = os.path.join(directory, "raw")
    os.makedirs(raw, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        [p.query for p in train] + [p.positive for p in train], vocab_size=4000
    )
    wordpiece.save_model(raw)
    tokenizer = BertTokenizerFast(os.path.join(raw, "vocab.txt"))
    torch.manual_seed(0)
    heads = max(1, width // 64)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=max(128, length),
    )
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = models.Transformer(raw, max_seq_length=length)
    pooling = models.Pooling(width, "mean")
    start = os.path.join(directory, "start")
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()]).save(start)
    return start


def order(seed: int, step: int, batch: int, count: int) -> np.ndarray:
    """Pair indices of global batch ``step``: bertjax's PairData order."""
    return source.shuffled_rows(seed, step, batch, slice(None), count, "pairs/order")


def heldout(encode, dev) -> dict:
    """NDCG@10, MRR@10, Recall@100 of the held-out queries over the held-out documents."""
    texts = list(dict.fromkeys(p.positive for p in dev))
    doc_of = {t: str(i) for i, t in enumerate(texts)}
    qrels = {str(i): {doc_of[p.positive]: 1} for i, p in enumerate(dev)}

    def unit(x):
        x = np.asarray(x, np.float32)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    queries, docs = unit(encode([p.query for p in dev])), unit(encode(texts))
    run = retrieval.dense_run(list(qrels), queries, list(doc_of.values()), docs)
    return retrieval.evaluate_run(run, qrels)


def run_bertjax(args, start, files, seed, batch, chunk, workdir) -> dict:
    from bertjax import embed, trainer
    from bertjax.trainer import load_config_file

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = load_config_file(os.path.join(root, "configs", "embed_tiny.py"))
    config.init_from = start
    config.seed = seed
    config.batch_size = batch
    config.num_train_steps = args.steps
    config.pairs.source, config.pairs.dev_file = files
    config.pairs.num_negatives = 0
    config.pairs.max_query_length = args.length
    config.data.max_seq_length = args.length
    config.loss.pooling, config.loss.normalize = "mean", True
    config.loss.scale = args.scale
    config.loss.gradcache_chunk_size = chunk
    config.optim.update(
        learning_rate=args.lr,
        base_batch_size=batch,
        warmup_steps=max(1, args.steps // 10),
        weight_decay=0.0,
        eps=1e-8,
        clip_norm=1.0,
        schedule="linear",
    )
    config.log_every = max(1, args.steps // 2)  # the second window has no compilation
    config.eval_every = 0
    config.progress_bar = False
    config.model.dtype = "float32"
    summary = trainer.train_and_evaluate(config, workdir)
    model = embed.load(workdir)
    return {
        **heldout(lambda texts: model.encode(texts, batch_size=64), args.dev),
        "steps_per_second": summary["perf/steps_per_second"],
    }


def run_sentence_transformers(args, start, seed, batch) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(seed)
    model = SentenceTransformer(start, device="cpu")
    model.max_seq_length = args.length
    loss = MultipleNegativesRankingLoss(model, scale=args.scale)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=1e-8, weight_decay=0.0)
    warmup = max(1, args.steps // 10)
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, args.steps)
    model.train()
    warm = max(1, args.steps // 2)
    start_time = None
    for step in range(args.steps):
        if step == warm:
            start_time = time.perf_counter()
        index = order(seed, step, batch, len(args.train))
        chosen = [args.train[i] for i in index]
        features = [
            {k: v for k, v in model.tokenize([p.query for p in chosen]).items()},
            {k: v for k, v in model.tokenize([p.positive for p in chosen]).items()},
        ]
        value = loss(features, None)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    elapsed = time.perf_counter() - start_time
    model.eval()
    with torch.no_grad():
        metrics = heldout(
            lambda texts: model.encode(texts, batch_size=64, convert_to_numpy=True), args.dev
        )
    return {**metrics, "steps_per_second": (args.steps - warm) / elapsed}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", default="", help="sentence-transformers dir ('' = random BERT)")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--gradcache_batch", type=int, default=128, help="0: skip GradCache")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    args.train, args.dev = pairs.split_pairs(pairs.builtin_pairs(), 0.1)
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        start = args.init or build_start(tmp, args.train, args.width, args.layers, args.length)
        files = []
        for name, items in (("train", args.train), ("dev", args.dev)):
            path = os.path.join(tmp, f"{name}.jsonl")
            with open(path, "w") as f:
                for p in items:
                    f.write(json.dumps({"query": p.query, "positive": p.positive}) + "\n")
            files.append(path)
        results = {"bertjax": [], "sentence_transformers": [], "bertjax_gradcache": []}
        for seed in seeds:
            work = os.path.join(tmp, f"bertjax_{seed}")
            results["bertjax"].append(
                run_bertjax(args, start, files, seed, args.batch_size, 0, work)
            )
            results["sentence_transformers"].append(
                run_sentence_transformers(args, start, seed, args.batch_size)
            )
            if args.gradcache_batch:
                work = os.path.join(tmp, f"gradcache_{seed}")
                results["bertjax_gradcache"].append(
                    run_bertjax(
                        args, start, files, seed, args.gradcache_batch, args.batch_size, work
                    )
                )
            print(json.dumps({k: v[-1] for k, v in results.items() if v}), flush=True)
    report = {
        "conditions": {
            k: getattr(args, k)
            for k in ("steps", "batch_size", "gradcache_batch", "lr", "scale", "length", "seeds")
        }
        | {"train_pairs": len(args.train), "heldout_pairs": len(args.dev), "init": args.init},
        **{k: summarize(v) for k, v in results.items() if v},
    }
    ours, theirs = report["bertjax"], report["sentence_transformers"]
    report["ndcg@10_difference_median"] = ours["ndcg@10"]["median"] - theirs["ndcg@10"]["median"]
    report["steps_per_second_ratio_median"] = (
        ours["steps_per_second"]["median"] / theirs["steps_per_second"]["median"]
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
