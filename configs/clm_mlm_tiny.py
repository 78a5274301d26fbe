"""CLM then MLM on one encoder at toy size (the recipe of Gisserot-Boukhlef et al., ICLR 2026,
"Should We Still Pretrain Encoders with MLM?"): phase 1 trains the ModernBERT-shaped encoder as a
causal LM (config.loss.objective="clm": causal attention, next-token loss on every real token,
10% of the inputs replaced by [MASK]); phase 2 switches to bidirectional MLM at 30% masking,
starting from phase 1's last checkpoint. One LR schedule spans both phases (reset_time=False:
a 2-step warmup, then constant).

Run:     python train.py --config=configs/clm_mlm_tiny.py --workdir=workdir/clm_mlm_tiny
Expect:  on a 2-core CPU about 1.5 minutes (measured, other work running); metrics.jsonl holds
         eval/clm_loss (held-out NLL per predicted token) at the switch and eval/mlm_accuracy at
         the end (a toy: 2 layers of width 64, 60 steps in all; no quality figure measured).
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
    config.data.mask_rate = 0.3
    config.data.eval_mask_rate = 0.15
    config.batch_size = 16
    config.num_train_steps = 60  # both phases
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 2
    config.optim.schedule = "constant"  # after its warmup, across the switch
    config.log_every, config.eval_every, config.checkpoint_every = 5, 1000, 5  # eval: phase ends
    config.eval_batches = 2
    config.phase_order = ("clm", "mlm")
    config.phases.clm = phase(
        steps=30,
        reset_time=False,
        loss={"objective": "clm"},
        data={"masking": "causal", "input_mask_rate": 0.1},
    )
    config.phases.mlm = phase(steps=30, reset_time=False)
    return recipe_variant(config, variant)
