"""BERT-tiny with a 4-expert top-1 mixture-of-experts feed-forward in every layer (Switch style).

Same data, sizes and optimizer as configs/bert_tiny.py; each token still runs one
128 -> 512 -> 128 feed-forward, so active parameters per token match the dense model.

Run:     python train.py --config=configs/moe_tiny.py --workdir=workdir/moe_tiny
Expect:  on a 2-core CPU about 2.5 minutes (0.82x dense steps/s). Measured at 1000 steps
         (python benchmarks/moe_compare.py --steps 1000): held-out MLM loss 6.157 vs 6.147 for
         the dense model, i.e. no gain yet at this length; 4.8% of tokens dropped.
"""
from bertjax.trainer import default_run_config


def get_config():
    config = default_run_config()
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 500
    config.data.vocab_size = 8000
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.objective = "nsp"
    config.model.num_experts = 4  # experts per MoE layer
    config.model.experts_per_token = 1  # top-1 routing (Switch)
    config.model.moe_layer_interval = 1  # every layer is MoE
    config.model.expert_capacity_factor = 1.25  # per-sequence expert capacity; overflow dropped
    config.model.router_z_loss_weight = 1e-3  # ST-MoE z-loss weight
    config.model.load_balance_loss_weight = 1e-2  # Switch balancing-loss weight
    config.mesh.expert = 1  # expert-parallel width on more devices (must divide num_experts)
    config.optim.learning_rate = 1e-3
    config.optim.base_batch_size = 32
    config.optim.warmup_steps = 50
    config.optim.weight_decay = 0.01
    config.log_every = 50
    config.eval_every = 500
    config.eval_batches = 16
    config.checkpoint_every = 500
    return config
