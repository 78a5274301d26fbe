"""ELECTRA-Small (Clark et al. 2020): replaced-token detection with a 1/4-width generator.

The discriminator is the paper's Small (Table 6): 12 layers, hidden 256, 4 heads, feed-forward
1024, 128-dim embeddings shared with the generator (each projects them to its own width); the
generator is 1/4 of its width, heads and feed-forward (64, 1 head, 256), 12 layers. Loss = MLM +
50 x replaced-token BCE over every real token; 15% of tokens masked (85% [MASK], 15% kept).
AdamW lr 5e-4, batch 128, 10k warmup steps then linear decay, weight decay 0.01, eps 1e-6, 1M
steps, sequences of 128 (google-research/electra configure_pretraining.py). Deviations: Adam here
has bias correction (ELECTRA's AdamWeightDecayOptimizer has none) and the linear decay runs from
the end of warmup (ELECTRA's polynomial decay spans every step).
Fine-tuning (ELECTRA's GLUE recipe, Table 7): lr 3e-4, layer-wise LR decay 0.8, batch 32,
10% warmup, weight decay 0 (the code's default is 0.01), 3 epochs (10 for RTE/STS-B), ELECTRA's
head (first token -> classifier: the default classifier_pooling "first" of an ELECTRA model), and
MRPC/STS-B on both orders of each pair (--config.task.double_unordered=True); GLUE dev results
are medians over seeds of the score at the end of training (python -m bertjax.glue's default).

Data:    sample_plan="mlm": contiguous text with BERT's 10% shorter rows (ELECTRA's input), planned
         per ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store
         of any size starts from its manifest and each host reads only its own pieces' index.
Run:     python train.py --config=configs/electra_small.py --workdir=gs://BUCKET/electra_small \
             --config.data.corpus='/data/owt/*.txt'
         python train.py --config=configs/finetune_glue.py --workdir=DIR/sst2 \
             --config.init_from=gs://BUCKET/electra_small --config.task.source=tfds:glue/sst2 \
             --config.loss.num_labels=2 --config.optim.learning_rate=3e-4 \
             --config.optim.layerwise_lr_decay=0.8 --config.optim.weight_decay=0.0
Expect:  14M discriminator parameters; the paper reports GLUE dev 79.9 after 1M steps (4 days
         on one V100; BERT-Small 75.1). On the built-in corpus it runs, but the corpus is far
         too small for this model (configs/electra_tiny.py is the CPU recipe).
"""

from bertjax.objectives.electra import add_electra_config
from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "small",
        num_hidden_layers=12,  # Table 6: 12 layers of hidden 256
        hidden_size=256,
        num_attention_heads=4,  # head size 64
        intermediate_size=1024,
        embedding_size=128,  # shared with the generator; each projects it to its width
        dtype="bfloat16",
    )
    add_electra_config(config)  # objective, model_type "electra", 85% [MASK] / 15% kept
    config.loss.mlm_weight = 1.0  # generator MLM loss weight
    config.loss.discriminator_weight = 50.0  # lambda
    config.loss.generator_hidden_size = 0.25  # Small: generator 1/4 of the width
    config.loss.generator_layers = 1.0  # as many layers as the discriminator
    config.mlm_bias_init = "zeros"  # BERT's init of the generator's MLM decoder bias (the paper's)
    config.batch_size = 128
    config.num_train_steps = 1_000_000
    config.data.vocab_size = 30522
    config.data.max_seq_length = 128
    config.data.mask_rate = 0.15
    config.data.max_predictions = 19  # int((0.15 + 0.005) * 128), as ELECTRA
    config.data.sample_plan = "mlm"  # contiguous text, 10% shorter rows; no sentence pairs
    config.optim.name = "adamw"
    config.optim.learning_rate = 5e-4
    config.optim.base_batch_size = 128
    config.optim.warmup_steps = 10_000
    config.optim.weight_decay = 0.01
    config.optim.eps = 1e-6
    config.optim.clip_norm = 1.0
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
