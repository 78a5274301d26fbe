"""Long-context Chinese RoBERTa: 1024 positions, whole-word masking, full-sentence rows of
mixed lengths (25% 128 / 50% 512 / 25% 1024 tokens, chosen per step), no NSP.

Data:    sample_plan="full_sentences": RoBERTa's FULL-SENTENCES rows of whole sentences, planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-16 (16 chips for batch 256 x 1024)
         check it: python -m bertjax.compile --config=configs/roberta_zh_long.py --topology=v5e-16
Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/roberta_zh_long.py --workdir=DIR \
             --config.data.corpus='/data/zh/*.txt'
Expect:  three compiled step shapes, reused as the schedule mixes them; remat, bf16 and two
         microbatches (set here) fit 1024-token rows; tokens/s drops on 1024 rows (attention
         is T^2).
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "base",
        model_type="roberta",
        position_offset=1,
        max_position_embeddings=1025,
        type_vocab_size=1,
        dtype="bfloat16",
        remat="dots",
        scan_layers=True,
    )
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    # 2 microbatches of 8 rows per chip on v5e-16: the whole batch at once left 10% of HBM free
    # at T=1024 (14.4 GiB of 16), two leave 45% (8.7 GiB); bertjax.compile, docs/results/compile.md
    config.optim.grad_accum_steps = 2
    config.num_train_steps = 500_000
    config.data.corpus = "data/zh/*.txt"  # your Chinese corpus
    config.data.language = "zh"
    config.data.vocab_size = 21128
    config.data.max_seq_length = 1024
    config.data.length_schedule = ((0.25, 128), (0.5, 512), (0.25, 1024))
    config.data.mixed_lengths = True
    config.data.max_predictions = 160
    config.data.sample_plan = "full_sentences"
    config.data.masking = "whole_word"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.lr_scaling = "sqrt"
    config.optim.b2 = 0.98
    config.optim.warmup_steps = 10_000
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
