"""BERT-base (Devlin et al. 2019) pretraining: MLM + NSP, 128 tokens, AdamW 1e-4, batch 256.

Run:     python train.py --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base \
             --config.data.corpus='/data/wiki/*.txt'
Expect:  the recipe of the paper's first phase (1M steps at 256 x 128); on one TPU v4-8 or
         8 GPUs in bf16 about 2-4 days; MLM accuracy ~0.65-0.70 on English Wikipedia+books.
         On the built-in corpus it runs but the corpus is far too small for this model.
"""

from bertjax.trainer import default_run_config, model_config_dict


def get_config():
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 1_000_000
    config.data.vocab_size = 30522
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.sample_plan = "nsp"
    config.optim.name = "adamw"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.optim.weight_decay = 0.01
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return config
