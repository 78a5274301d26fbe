"""Chinese BERT-wwm (Cui et al. 2019): whole-word masking with jieba word boundaries, MLM + NSP.

Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/bert_wwm_zh.py --workdir=DIR \
             --config.data.corpus='/data/zh/*.txt'
         (BERT format: one sentence per line, a blank line between documents; or set
         --config.data.corpus_format=documents for one document per line)
Expect:  every piece of a masked word is masked together (no reference files: boundaries are
         stored per token in the store); MLM accuracy ~0.60 on Chinese Wikipedia after 1M steps.
"""

from bertjax.trainer import default_run_config, model_config_dict


def get_config():
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 1_000_000
    config.data.corpus = "data/zh/*.txt"  # your Chinese corpus
    config.data.language = "zh"
    config.data.vocab_size = 21128
    config.data.max_seq_length = 512
    config.data.max_predictions = 80
    config.data.sample_plan = "nsp"
    config.data.masking = "whole_word"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return config
