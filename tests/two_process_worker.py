"""Shared tiny setup for the step tests, and the worker of the two-process test.

As a script: ``python two_process_worker.py PORT PROCESS_ID NUM_PROCESSES OUT_JSON [WORKDIR]``
joins a localhost `jax.distributed` run with 2 CPU devices per process, trains a few steps on
its rows of the global batch, and (process 0) writes the per-step losses to OUT_JSON. With a
WORKDIR (a URL), both processes then run the trainer into that one workdir.
"""

import json
import sys

import numpy as np

BATCH, LENGTH, PREDICTIONS, VOCAB = 16, 32, 5, 128
NUM_STEPS = 2


def tiny_model_config(**overrides):
    """BERT-tiny shrunk further; 4 heads so tensor=4 divides them; no dropout."""
    import bertjax

    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=LENGTH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    fields.update(overrides)
    return bertjax.BertConfig.preset("tiny", **fields)


def step_config(**mesh):
    """Step config: batch 16, AdamW at a constant-ish 1e-3 without warmup, the given mesh."""
    from bertjax import step

    config = step.default_step_config()
    config.batch_size = BATCH
    config.optim.learning_rate = 1e-3
    config.optim.warmup_fraction = 0.0
    config.optim.total_steps = 100
    for axis, size in mesh.items():
        config.mesh[axis] = size
    return config


def synthetic_batch(seed: int, batch: int = BATCH) -> dict:
    """A pretraining batch with padding rows and zero-weight prediction slots."""
    rs = np.random.RandomState(seed)
    attention_mask = np.ones((batch, LENGTH), np.int32)
    attention_mask[::3, LENGTH - 7 :] = 0
    weights = np.ones((batch, PREDICTIONS), np.float32)
    weights[::2, -2:] = 0.0
    token_types = np.zeros((batch, LENGTH), np.int32)
    token_types[:, LENGTH // 2 :] = 1
    return dict(
        input_ids=rs.randint(5, VOCAB, (batch, LENGTH)).astype(np.int32),
        token_type_ids=token_types,
        attention_mask=attention_mask,
        masked_positions=rs.randint(1, LENGTH - 7, (batch, PREDICTIONS)).astype(np.int32),
        masked_ids=rs.randint(5, VOCAB, (batch, PREDICTIONS)).astype(np.int32),
        masked_weights=weights,
        next_sentence_label=rs.randint(0, 2, (batch,)).astype(np.int32),
    )


def train_losses(mesh) -> list:
    """Losses of NUM_STEPS steps on `mesh`, each process feeding only its rows."""
    import jax

    from bertjax import step
    from bertjax.training import sharding

    config = step_config(data=-1)
    state = step.init_train_state(config, tiny_model_config(), mesh, jax.random.key(0))
    steps = step.jit_steps(state, mesh, step.FAST_COMPILE)
    rows = sharding.process_batch_rows(mesh, BATCH)
    losses = []
    for index in range(NUM_STEPS):
        local = {k: v[rows] for k, v in synthetic_batch(index).items()}
        state, metrics = steps.train(
            state, sharding.global_batch(local, mesh, BATCH), jax.random.key(1)
        )
        losses.append(metrics["loss"])
    return [float(loss) for loss in losses]


def shared_workdir_run(workdir: str) -> dict:
    """Both processes train the tiny default recipe into one (URL) workdir: the tokenizer is
    trained by process 0 and read by both, the checkpoints are written together."""
    import os

    from bertjax import trainer

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = trainer.load_config_file(os.path.join(root, "configs", "bert_tiny.py"))
    config.batch_size, config.num_train_steps = 8, 4
    config.data.max_seq_length, config.data.max_predictions, config.data.vocab_size = 32, 5, 400
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size = 64
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 2, 0
    config.checkpoint_every, config.progress_bar = 4, False
    config.fast_compile = True
    config.peak_flops_per_device = 1e12  # no CPU matmul peak measured at start (~1 s)
    return trainer.train_and_evaluate(config, workdir)


def main(port: int, process_id: int, num_processes: int, out_path: str, workdir: str = "") -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_default_matmul_precision", "highest")
    jax.distributed.initialize(
        f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    from bertjax.training import sharding

    mesh = sharding.make_mesh(step_config(data=-1).mesh)
    losses = train_losses(mesh)
    shared = shared_workdir_run(workdir) if workdir else {}
    if process_id == 0:
        with open(out_path, "w") as f:
            rows = sharding.process_batch_rows(mesh, BATCH)
            json.dump(
                {
                    "losses": losses,
                    "devices": jax.device_count(),
                    "local_devices": jax.local_device_count(),
                    "rows": [rows.start, rows.stop],
                    "shared_workdir_step": shared.get("step"),
                },
                f,
            )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6])
