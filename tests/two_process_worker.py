"""Shared tiny setup for the step tests (imported as ``setup``): a tiny model config, a step
config, a synthetic pretraining batch. (The multi-process runs: tests/multiprocess_worker.py.)
"""

import numpy as np

BATCH, LENGTH, PREDICTIONS, VOCAB = 16, 32, 5, 128


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
