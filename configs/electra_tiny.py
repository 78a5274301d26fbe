"""ELECTRA-tiny on the built-in corpus: the recipe of configs/bert_tiny.py (tokenizer, data,
model, optimizer) with replaced-token detection in place of MLM + NSP.

The discriminator is bert_tiny's encoder (2 layers of 128, 2 heads, layer 0's heads on the left
and right neighbour); the generator is 1/4 of its width (32, 1 head, feed-forward 128), 2 layers,
reading the shared 128-dim embeddings through a 128 -> 32 projection. Loss = MLM + 50 x
replaced-token BCE over every real token; ELECTRA's 15% masking (85% [MASK], 15% kept); rows of
contiguous text (no sentence pairs). Held-out batches mask 15% as bert_tiny's do.

Run:     python train.py --config=configs/electra_tiny.py --workdir=workdir/electra_tiny
         python train.py --config=configs/finetune_glue.py --workdir=workdir/ft_electra \
             --config.init_from=workdir/electra_tiny
Expect:  on a 2-core CPU about 4.5 minutes (79 ms per step against bert_tiny's 72). Measured
         (benchmarks/comparisons/electra_compare.py, 2734 steps = bert_tiny's 3000 in wall time):
         held-out generator MLM accuracy 0.197; replaced-token accuracy 0.871 against 0.874 for "all
         original", AUC 0.59 (0.56 at step 450): at this scale the discriminator barely starts
         learning in this budget, and fine-tuned with configs/finetune_glue.py it reaches 0.653
         dev accuracy (0.653-0.678, 3 seeds) against 0.758 from bert_tiny
         (docs/results/comparisons.md).
"""

import os

from bertjax.objectives.electra import add_electra_config
from bertjax.trainer import load_config_file, recipe_variant


def get_config(variant=""):
    config = load_config_file(os.path.join(os.path.dirname(__file__), "bert_tiny.py"))
    add_electra_config(config)  # objective, model_type "electra", 85% [MASK] / 15% kept
    config.loss.mlm_weight = 1.0  # generator MLM loss weight
    config.loss.discriminator_weight = 50.0  # lambda, as the paper
    config.loss.generator_hidden_size = 0.25  # generator 1/4 of the width, as ELECTRA-Small
    config.loss.generator_layers = 1.0  # as many layers as the discriminator
    config.data.sample_plan = "mlm"  # contiguous text, 10% shorter rows; no sentence pairs
    config.data.mask_rate = 0.15  # ELECTRA masks 15% (bert_tiny trains at 30%)
    config.data.max_predictions = 20
    return recipe_variant(config, variant)
