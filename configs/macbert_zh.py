"""MacBERT (Cui et al. 2020): whole-word n-gram masking (1-4 words at 40/30/20/10%), masked
words replaced by similar words instead of [MASK] ("MLM as correction"), and SOP.

Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/macbert_zh.py --workdir=DIR \
             --config.data.corpus='/data/zh/*.txt' \
             --config.data.similar_words_file=/data/zh/similar.tsv
         (similar.tsv: "word<TAB>similar1 similar2 ..." per line, e.g. from a synonym toolkit;
         or a .npy [V, D] embedding matrix whose cosine neighbours are used)
Expect:  no [MASK] token in the inputs apart from the share set by mask_token_prob's slot,
         which now carries similar words; random fallback when a word has no neighbour.
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
    config.data.sample_plan = "sop"
    config.data.masking = "ngram"
    config.data.ngram_max = 4
    config.data.ngram_weights = (0.4, 0.3, 0.2, 0.1)
    config.data.correction = True
    config.data.similar_words_file = "data/zh/similar_words.tsv"  # your similarity table
    config.optim.name = "lamb"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return config
