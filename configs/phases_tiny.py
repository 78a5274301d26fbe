"""A three-phase ModernBERT-style recipe at toy size, the one the tests run: phase 1 at 64 tokens
with batch-size warmup (4 -> 8 -> 12, then 16), 30% masking and StableAdamW; phase 2 extends the
context to 128 tokens and raises the global RoPE base (10k -> 160k); phase 3 decays the LR with
1-sqrt at 15% masking. Each phase restarts its schedule (reset_time) from the previous one's end.

Run:     python train.py --config=configs/phases_tiny.py --workdir=workdir/phases_tiny
Expect:  on a 2-core CPU about a minute; the held-out MLM accuracy of each phase's end in
         metrics.jsonl (a toy: 2 layers of width 64, 60 steps in all).
"""

import os

from bertjax.trainer import load_config_file, model_config_dict, phase, recipe_variant


def get_config(variant=""):
    config = load_config_file(os.path.join(os.path.dirname(__file__), "modernbert_tiny.py"))
    config.model = model_config_dict(
        "modernbert-tiny",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=96,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        local_attention_window=16,
        global_attn_every_n_layers=2,
        rope_theta=10000.0,
        local_rope_theta=10000.0,
    )
    config.data.vocab_size = 2000
    config.data.max_seq_length = 64
    config.data.max_predictions = 20
    config.data.eval_max_predictions = 10
    config.batch_size = 16
    config.batch_warmup.tokens = 64 * 24 * 4  # sizes 4, 8, 12: four steps each
    config.batch_warmup.quantum = 4
    config.optim.name = "stableadamw"  # ModernBERT's optimizer and decay
    config.optim.weight_decay = 1e-5
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 2
    config.optim.schedule = "constant"  # after its warmup (phase 1 and 2)
    config.log_every, config.eval_every, config.checkpoint_every = 4, 1000, 4  # eval: phase ends
    config.eval_batches = 2
    config.phase_order = ("pretrain", "extend", "decay")
    config.phases.pretrain = phase(steps=24)
    config.phases.extend = phase(
        steps=16,
        data={"max_seq_length": 128, "max_predictions": 40},
        model={"rope_theta": 160000.0},
        batch_size=8,
        batch_warmup={"tokens": 0},
    )
    config.phases.decay = phase(
        steps=20,
        data={"max_seq_length": 128, "max_predictions": 20, "mask_rate": 0.15},
        model={"rope_theta": 160000.0},
        batch_size=8,
        batch_warmup={"tokens": 0},
        optim={"schedule": "1-sqrt", "warmup_steps": 0, "warmup_fraction": 0.0},
    )
    return recipe_variant(config, variant)
