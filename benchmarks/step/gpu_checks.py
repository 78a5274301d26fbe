"""Do the fast paths compute the same step? Loss and gradients of each attention implementation
in bf16, against float32 XLA at the highest matmul precision, on padded rows.

  python benchmarks/step/gpu_checks.py                       # on an accelerator: xla and cudnn
  python benchmarks/step/gpu_checks.py --impls xla --hidden 64 --heads 2 --intermediate 128 \
      --vocab 512

Prints one line per case with the relative errors ||x - ref|| / ||ref|| and exits non-zero when
one is over its bound (bf16 operands: loss 1e-2, gradients 3e-2). Dropout is off so every case
computes the same function; the rows have random real lengths (padding at the end), so the
attention mask matters.

Then attention dropout (rate 0.1): the loss and gradient norm over ``--dropout-draws`` draws
of the automatic kernel (cuDNN on a GPU, which draws its own bits) beside the exact path's (the
step's key), each mean within 4 standard errors of the other. cuDNN's bits cannot be compared
with the exact path's one by one: this checks that they drop what the rate says, on average.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from step_throughput import single_device_state  # noqa: E402  (benchmarks/ is on sys.path)

import bertjax
from bertjax.training import step as step_internals

LOSS_BOUND, GRAD_BOUND = 1e-2, 3e-2


def padded_batch(batch: int, length: int, vocab: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 2, length + 1, batch)
    real = np.arange(length)[None] < lengths[:, None]
    ids = np.where(real, rng.integers(5, vocab, (batch, length)), 0).astype(np.int32)
    predictions = max(1, round(0.15 * length // 2))
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, n), predictions, replace=False) for n in lengths]), axis=1
    ).astype(np.int32)
    return {
        "input_ids": ids,
        "attention_mask": real.astype(np.int32),
        "token_type_ids": ((np.arange(length)[None] >= lengths[:, None] // 2) & real).astype(
            np.int32
        ),
        "masked_positions": positions,
        "masked_ids": np.take_along_axis(ids, positions, 1),
        "masked_weights": np.ones(positions.shape, np.float32),
        "next_sentence_label": rng.integers(0, 2, batch).astype(np.int32),
    }


def loss_and_grads(cfg, batch: dict, precision: str):
    with jax.default_matmul_precision(precision):
        state, _, device_batch = single_device_state(cfg, batch)

        @jax.jit
        def run(state, batch):
            grads, sums, norms = step_internals._gradients(state, batch, jax.random.key(1))
            return state.spec.objective.loss(sums, norms), grads

        loss, grads = run(state, device_batch)
    flat = np.concatenate([np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(grads)])
    return float(loss), flat


def dropout_draws(cfg, batch: dict, draws: int) -> np.ndarray:
    """[draws, 2]: loss and gradient norm of one step's gradients under attention dropout, a new
    key each draw (cuDNN ignores it: its offset advances at each execution)."""
    state, _, device_batch = single_device_state(cfg, batch)

    @jax.jit
    def run(state, batch, key):
        grads, sums, norms = step_internals._gradients(state, batch, key)
        loss = state.spec.objective.loss(sums, norms)
        return loss, jnp.sqrt(
            sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads))
        )

    out = [run(state, device_batch, jax.random.key(i)) for i in range(draws)]
    return np.array([[float(loss), float(norm)] for loss, norm in out])


def check_dropout(cfg, batch: dict, draws: int) -> bool:
    """The automatic kernel's dropout against the exact path's: means within 4 standard errors."""
    cfg = cfg.replace(dtype="bfloat16", attention_probs_dropout_prob=0.1)
    auto = dropout_draws(cfg, batch, draws)
    exact = dropout_draws(cfg.replace(attention_implementation="exact"), batch, draws)
    error = np.sqrt(auto.var(0, ddof=1) / draws + exact.var(0, ddof=1) / draws) + 1e-12
    ok = bool(np.all(np.abs(auto.mean(0) - exact.mean(0)) <= 4 * error))
    print(
        f"{'ok  ' if ok else 'FAIL'} dropout 0.1, {draws} draws, automatic kernel vs exact: loss "
        f"{auto[:, 0].mean():.5f} vs {exact[:, 0].mean():.5f}, grad norm {auto[:, 1].mean():.4f} "
        f"vs {exact[:, 1].mean():.4f} (4 standard errors: {4 * error[0]:.1e}, {4 * error[1]:.1e})",
        flush=True,
    )
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", default="xla,cudnn")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--dropout-draws", type=int, default=8, help="0: skip the dropout check")
    args = parser.parse_args()
    failures, start = 0, time.perf_counter()
    for length in (int(x) for x in args.lengths.split(",")):
        cfg = bertjax.BertConfig(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            intermediate_size=args.intermediate,
            max_position_embeddings=max(512, length),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        batch = padded_batch(args.batch, length, args.vocab, seed=length)
        ref_loss, ref_grads = loss_and_grads(
            cfg.replace(attention_implementation="xla"), batch, "highest"
        )
        for impl in args.impls.split(","):
            loss, grads = loss_and_grads(
                cfg.replace(dtype="bfloat16", attention_implementation=impl), batch, "default"
            )
            loss_error = abs(loss - ref_loss) / abs(ref_loss)
            grad_error = np.linalg.norm(grads - ref_grads) / np.linalg.norm(ref_grads)
            ok = np.isfinite(loss) and loss_error < LOSS_BOUND and grad_error < GRAD_BOUND
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} T={length} attention={impl} bf16 vs float32 xla: "
                f"loss {loss:.5f} vs {ref_loss:.5f} (rel {loss_error:.2e} < {LOSS_BOUND}), "
                f"grads rel {grad_error:.2e} < {GRAD_BOUND} "
                f"[{time.perf_counter() - start:.0f} s]",
                flush=True,
            )
        if args.dropout_draws > 1 and length == int(args.lengths.split(",")[0]):
            failures += not check_dropout(cfg, batch, args.dropout_draws)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
