"""BERT-tiny on the built-in corpus, MLM + NSP: the embedded default of `python train.py`.

Run:     python train.py --config=configs/bert_tiny.py --workdir=workdir/bert_tiny
Expect:  on a 2-core CPU, about 8 minutes; held-out MLM accuracy above 0.20 against a
         most-frequent-token baseline of about 0.04.
"""
from bertjax.trainer import default_run_config


def get_config():
    config = default_run_config()
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 1500
    config.data.vocab_size = 8000
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.objective = "nsp"
    config.optim.learning_rate = 1e-3
    config.optim.base_batch_size = 32
    config.optim.warmup_steps = 100
    config.optim.weight_decay = 0.01
    config.log_every = 50
    config.eval_every = 500
    config.eval_batches = 16
    config.checkpoint_every = 500
    return config
