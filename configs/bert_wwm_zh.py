"""Chinese BERT-wwm (Cui et al. 2019): whole-word masking with jieba word boundaries, MLM + NSP.

Data:    sample_plan="nsp": BERT's sentence pairs with NSP labels (the paper's input), planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-32 (16 chips for batch 2560 x 128; the source trained on a TPU v3)
         check it: python -m bertjax.compile --config=configs/bert_wwm_zh.py --topology=v5p-32
Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/bert_wwm_zh.py --workdir=DIR \
             --config.data.corpus='/data/zh/*.txt'
         (BERT format: one sentence per line, a blank line between documents; or set
         --config.data.corpus_format=documents for one document per line)
             --config.init_from=/models/bert-base-chinese   # Google's Chinese BERT (HF dir)
Expect:  every piece of a masked word is masked together (no reference files: boundaries are
         stored per token in the store); MLM accuracy ~0.60 on Chinese Wikipedia.

The HFL recipe (ymcui/Chinese-BERT-wwm README, model table): LAMB, initialised from Google's
Chinese BERT (pretraining ``init_from``: its weights, and its vocab.txt as the tokenizer), 100K
steps at 128 tokens with batch 2560, then 100K at 512 with batch 384. Word boundaries come from
jieba (bertjax's zh extra) where HFL used HIT's LTP, which needs its own model downloads; the two
segmenters disagree on some words, so the masked spans differ somewhat. Not in the README,
chosen here: peak LR 1e-4 (BERT's; not checked against HFL's paper), 10% warmup and a linear
decay in each phase (reset_time).
"""

from bertjax.trainer import default_run_config, model_config_dict, phase, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.init_from = ""  # Google's Chinese BERT (an HF directory): the recipe starts from it
    config.batch_size = 2560
    config.num_train_steps = 200_000
    config.data.corpus = "data/zh/*.txt"  # your Chinese corpus
    config.data.language = "zh"
    config.data.vocab_size = 21128
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.sample_plan = "nsp"
    config.data.masking = "whole_word"
    config.optim.name = "lamb"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 2560
    config.optim.warmup_steps = 0
    config.optim.warmup_fraction = 0.1
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    config.phase_order = ("seq128", "seq512")
    config.phases.seq128 = phase(steps=100_000)
    config.phases.seq512 = phase(
        steps=100_000, batch_size=384, data={"max_seq_length": 512, "max_predictions": 80}
    )
    return recipe_variant(config, variant)
