"""ELECTRA-Base (Clark et al. 2020): replaced-token detection with a 1/3-width generator.

The discriminator is BERT-base's shape (Table 6): 12 layers, hidden 768, 12 heads, feed-forward
3072, 768-dim embeddings shared with the generator; the generator is 1/3 of its width, heads and
feed-forward (256, 4 heads, 1024), 12 layers, with its own 768 -> 256 projection. Loss = MLM + 50
x replaced-token BCE over every real token; 15% of tokens masked (85% [MASK], 15% kept). AdamW lr
2e-4, batch 256, 10k warmup steps then linear decay, weight decay 0.01, eps 1e-6, 766k steps
(ELECTRA-Base in the paper's compute-matched comparison with BERT-Base's 1M), sequences of 512
(Table 6). Deviations: Adam here has bias
correction (ELECTRA's AdamWeightDecayOptimizer has none) and the linear decay runs from the end
of warmup (ELECTRA's polynomial decay spans every step).
Fine-tuning (ELECTRA's GLUE recipe, Table 7): lr 1e-4, layer-wise LR decay 0.8, batch 32,
10% warmup, weight decay 0 (the code's default is 0.01), 3 epochs (10 for RTE/STS-B), ELECTRA's
head (first token -> classifier: the default classifier_pooling "first" of an ELECTRA model), and
MRPC/STS-B on both orders of each pair (--config.task.double_unordered=True); GLUE dev results
are medians over seeds of the score at the end of training (python -m bertjax.glue's default).

Data:    sample_plan="mlm": contiguous text with BERT's 10% shorter rows (ELECTRA's input), planned
         per ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store
         of any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-32 (v5e-16 left 6% of HBM free; ELECTRA-base trained on a TPU v3-16)
         check it: python -m bertjax.compile --config=configs/electra_base.py --topology=v5e-32
Run:     python train.py --config=configs/electra_base.py --workdir=gs://BUCKET/electra_base \
             --config.data.corpus='/data/wiki/*.txt'
         python train.py --config=configs/finetune_glue.py --workdir=DIR/mnli \
             --config.init_from=gs://BUCKET/electra_base --config.task.source=tfds:glue/mnli \
             --config.loss.num_labels=3 --config.optim.learning_rate=1e-4 \
             --config.optim.layerwise_lr_decay=0.8 --config.optim.weight_decay=0.0
Expect:  110M discriminator parameters; on one TPU v4-8 or 8 GPUs in bf16 a few days; the paper
         reports GLUE dev 85.1 for ELECTRA-Base (BERT-Base 82.2) on Wikipedia+books.
"""

from bertjax.objectives.electra import add_electra_config
from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")  # 12 x 768, 12 heads, 3072
    add_electra_config(config)  # objective, model_type "electra", 85% [MASK] / 15% kept
    config.loss.mlm_weight = 1.0  # generator MLM loss weight
    config.loss.discriminator_weight = 50.0  # lambda
    config.loss.generator_hidden_size = 1 / 3  # Base: generator 1/3 of the width
    config.loss.generator_layers = 1.0  # as many layers as the discriminator
    config.mlm_bias_init = "zeros"  # BERT's init of the generator's MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 766_000
    config.data.vocab_size = 30522
    config.data.max_seq_length = 512
    config.data.mask_rate = 0.15
    config.data.max_predictions = 79  # int((0.15 + 0.005) * 512), as ELECTRA
    config.data.sample_plan = "mlm"  # contiguous text, 10% shorter rows; no sentence pairs
    config.optim.name = "adamw"
    config.optim.learning_rate = 2e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.optim.weight_decay = 0.01
    config.optim.eps = 1e-6
    config.optim.clip_norm = 1.0
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
