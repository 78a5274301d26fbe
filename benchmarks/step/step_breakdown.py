"""Where the train step's time goes (B=32, T=128, 20 masked positions, vocab 30522, no dropout):
the loss forward, forward+backward, the encoder alone (no MLM/NSP head) forward+backward, and the
full jitted, donated train step (adds clipping and AdamW). Medians of 5 after one warm-up call.

  python benchmarks/step/step_breakdown.py [--sizes tiny,mini]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import BertConfig, sharding
from bertjax import step as step_lib

BATCH, LENGTH, PREDICTIONS = 32, 128, 20


def _median_ms(fn, *args, repeats=5):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def _batch(cfg):
    rs = np.random.RandomState(0)
    return dict(
        input_ids=rs.randint(5, cfg.vocab_size, (BATCH, LENGTH)).astype(np.int32),
        token_type_ids=np.zeros((BATCH, LENGTH), np.int32),
        attention_mask=np.ones((BATCH, LENGTH), np.int32),
        masked_positions=np.sort(rs.rand(BATCH, LENGTH).argsort(1)[:, :PREDICTIONS], 1).astype(
            np.int32
        ),
        masked_ids=rs.randint(5, cfg.vocab_size, (BATCH, PREDICTIONS)).astype(np.int32),
        masked_weights=np.ones((BATCH, PREDICTIONS), np.float32),
        next_sentence_label=np.zeros(BATCH, np.int32),
    )


def breakdown(size: str) -> dict:
    cfg = BertConfig.preset(size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = step_lib.default_step_config()
    config.batch_size = BATCH
    mesh = sharding.make_mesh(config.mesh)
    state = step_lib.init_train_state(config, cfg, mesh, jax.random.key(0))
    spec, host_batch = state.spec, _batch(cfg)
    batch = {k: jnp.asarray(v) for k, v in host_batch.items()}
    model = spec.model()

    def outputs(params, module=model):
        return spec.objective.apply(module, {"params": params}, batch, None, True)

    def loss(params):
        out = outputs(params)
        sums, norms = spec.objective.sums(out, batch), spec.objective.norms(batch)
        return spec.objective.loss(sums, norms)

    def encoder_only(params):
        full = model.clone(sparse_last_layer=False)  # every row's sequence output
        return jnp.sum(outputs(params, full)["sequence_output"] ** 2)

    result = {
        "loss forward": _median_ms(jax.jit(loss), state.params),
        "forward+backward": _median_ms(jax.jit(jax.grad(loss)), state.params),
        "encoder only fwd+bwd": _median_ms(jax.jit(jax.grad(encoder_only)), state.params),
    }
    steps = step_lib.jit_steps(state, mesh)
    global_batch = sharding.global_batch(host_batch, mesh, BATCH)
    rng = jax.random.key(1)
    holder = [state]

    def train():
        holder[0], metrics = steps.train(holder[0], global_batch, rng)
        return metrics

    result["full train step"] = _median_ms(train)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,mini")
    args = parser.parse_args()
    print(
        "| model | "
        + " | ".join(
            ["loss forward", "forward+backward", "encoder only fwd+bwd", "full train step"]
        )
        + " |"
    )
    print("|---|---|---|---|---|")
    for size in args.sizes.split(","):
        row = breakdown(size)
        print(f"| {size} | " + " | ".join(f"{v:.0f}" for v in row.values()) + " |", flush=True)


if __name__ == "__main__":
    from bertjax.training.runtime import reexec_with_hugepage_malloc

    reexec_with_hugepage_malloc()  # what train.py runs with (bertjax/training/runtime.py)
    main()
