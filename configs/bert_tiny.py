"""BERT-tiny on the built-in corpus, MLM + NSP: the embedded default of `python train.py`.

Run:     python train.py --config=configs/bert_tiny.py --workdir=workdir/bert_tiny
Expect:  on a 2-core CPU about 7 minutes; held-out MLM accuracy about 0.14 (0.119 at step 500,
         0.137 at 1000, 0.139 at 2000) against a most-frequent-token baseline of 0.045, NSP
         accuracy about 0.6. (transformers' PyTorch BERT-tiny reached 0.13 in 8 minutes here.)
"""
from bertjax.trainer import default_run_config


def get_config():
    config = default_run_config()
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 2000
    # Short runs underfit: no dropout (also enables the fused attention path).
    config.model.hidden_dropout_prob = 0.0
    config.model.attention_probs_dropout_prob = 0.0
    config.data.vocab_size = 8000
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.objective = "nsp"
    config.optim.learning_rate = 2e-3  # 5e-3 stalls post-LN BERT-tiny at the unigram plateau
    config.optim.base_batch_size = 32
    config.optim.warmup_steps = 100
    config.optim.weight_decay = 0.01
    config.log_every = 50
    config.eval_every = 500
    config.eval_batches = 16
    config.checkpoint_every = 500
    return config
