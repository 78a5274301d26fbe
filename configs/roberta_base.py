"""RoBERTa-base (Liu et al. 2019): FULL-SENTENCES rows, dynamic masking, no NSP, batch 8k.

The optimizer is the paper's Table 9 (base): peak LR 6e-4 at batch 8k, 24k warmup steps, then
linear decay over 500k steps, Adam b2 0.98, eps 1e-6, weight decay 0.01, no gradient clipping
(fairseq's RoBERTa pretraining config: clip_norm 0).

Data:    sample_plan="full_sentences": RoBERTa's FULL-SENTENCES rows of whole sentences, planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-128 (64 chips for batch 8192 x 512; RoBERTa trained on V100 GPUs)
         check it: python -m bertjax.compile --config=configs/roberta_base.py --topology=v5p-128
Run:     python train.py --config=configs/roberta_base.py --workdir=DIR \
             --config.data.corpus='/data/*.txt'
Expect:  peak LR 6e-4 at batch 8192 (a smaller --config.batch_size scales it by the square root
         of the ratio); masks change every epoch (the epoch is part of the mask key).
         MLM accuracy ~0.70 after 500k steps on a large corpus.
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    # position_offset = pad id + 1 as in fairseq/HF RoBERTa (bertjax tokenizers put [PAD] at 0).
    config.model = model_config_dict(
        "base",
        model_type="roberta",
        position_offset=1,
        max_position_embeddings=513,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        dtype="bfloat16",
    )
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 8192
    config.num_train_steps = 500_000
    config.data.vocab_size = 50265
    config.data.tokenizer_type = "bpe"
    config.data.max_seq_length = 512
    config.data.max_predictions = 80
    config.data.sample_plan = "full_sentences"
    config.optim.learning_rate = 6e-4  # the paper's peak LR (Table 9) ...
    config.optim.base_batch_size = 8192  # ... at its batch of 8k
    config.optim.lr_scaling = "sqrt"  # other batch sizes: LR x sqrt(batch / 8192)
    config.optim.b2 = 0.98  # the paper's Adam b2 (eps 1e-6 and weight decay 0.01: defaults)
    config.optim.clip_norm = 0.0  # RoBERTa clips no gradients (Table 9; fairseq clip_norm 0)
    config.optim.warmup_steps = 24_000  # the paper's warmup
    config.optim.grad_accum_steps = 1  # raise it when 8192 x 512 does not fit the devices
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
