"""ALBERT-base (Lan et al. 2020): 128-dim factorized embeddings, one shared layer, SOP,
n-gram masking (n <= 3, p ~ 1/n), LAMB at batch 4096.

Data:    sample_plan="sop": ALBERT's sentence-order pairs (the paper's input), planned per ~1
         M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of any
         size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-128 (64 chips for batch 4096 x 512; ALBERT trained on 64-512 TPU v3 chips)
         check it: python -m bertjax.compile --config=configs/albert_base.py --topology=v5p-128
Run:     python train.py --config=configs/albert_base.py --workdir=DIR \
             --config.data.corpus='/data/*.txt'
Expect:  12M parameters; SOP accuracy well above 0.5 within the first 10k steps; MLM
         accuracy ~0.55 after 125k steps on Wikipedia+books.
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "base",
        model_type="albert",
        embedding_size=128,
        num_hidden_groups=1,
        hidden_act="gelu_new",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        dtype="bfloat16",
    )
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 4096
    config.num_train_steps = 125_000
    config.data.vocab_size = 30000
    config.data.max_seq_length = 512
    config.data.max_predictions = 20
    config.data.sample_plan = "sop"
    config.data.masking = "ngram"
    config.data.ngram_max = 3
    config.optim.name = "lamb"
    config.optim.learning_rate = 0.00176
    config.optim.base_batch_size = 4096
    config.optim.warmup_steps = 3125
    config.log_every = 100
    config.eval_every = 5000
    config.checkpoint_every = 5000
    return recipe_variant(config, variant)
