"""BERT-tiny with a 4-expert top-1 mixture-of-experts feed-forward in every layer (Switch style).

The recipe of configs/bert_tiny.py (data, masking, optimizer, init including the local-attention
heads) plus the MoE fields; each token still runs one 128 -> 512 -> 128 feed-forward, so active
parameters per token match the dense model.

Run:     python train.py --config=configs/moe_tiny.py --workdir=workdir/moe_tiny
         python benchmarks/comparisons/moe_compare.py --steps 3000      # beside the dense model
Expect:  on a 2-core CPU about 6.5 minutes (0.82x the dense steps/s). Measured (moe_compare, 3000
         steps, same seed and data): held-out MLM loss 4.007 vs 4.034 dense, accuracy 0.357 vs
         0.350 (MoE ahead from step 2000; behind at 1000: 4.601 vs 4.588); ~6% of token-choices
         dropped at capacity 1.25; balance loss 1.02 (1 = uniform). At 1000 steps
         (1000-step schedule) dense 4.763, this config 4.809, moe_routing="expert_choice" with
         capacity 1.0 4.781 at 0.97x the dense steps/s (token choice: 0.76x).
"""

import os

from bertjax.trainer import load_config_file, recipe_variant


def get_config(variant=""):
    config = load_config_file(os.path.join(os.path.dirname(__file__), "bert_tiny.py"))
    config.model.num_experts = 4  # experts per MoE layer
    config.model.experts_per_token = 1  # top-1 routing (Switch)
    config.model.moe_layer_interval = 1  # every layer is MoE
    config.model.expert_capacity_factor = 1.25  # per-sequence expert capacity; overflow dropped
    config.model.router_z_loss_weight = 1e-3  # ST-MoE z-loss weight
    config.model.load_balance_loss_weight = 1e-2  # Switch balancing-loss weight
    config.mesh.expert = 1  # expert-parallel width on more devices (must divide num_experts)
    return recipe_variant(config, variant)
