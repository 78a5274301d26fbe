"""RoBERTa-base (Liu et al. 2019): FULL-SENTENCES rows, dynamic masking, no NSP, batch 8k.

Run:     python train.py --config=configs/roberta_base.py --workdir=DIR \
             --config.data.corpus='/data/*.txt'
Expect:  the LR follows the square-root batch rule from 1e-4 at batch 256: 5.7e-4 at 8192,
         close to the paper's 6e-4; masks change every epoch (the epoch is part of the mask key).
         MLM accuracy ~0.70 after 500k steps on a large corpus.
"""

from bertjax.trainer import default_run_config, model_config_dict


def get_config():
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
    config.batch_size = 8192
    config.num_train_steps = 500_000
    config.data.vocab_size = 50265
    config.data.tokenizer_type = "bpe"
    config.data.max_seq_length = 512
    config.data.max_predictions = 80
    config.data.sample_plan = "full_sentences"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.lr_scaling = "sqrt"
    config.optim.b2 = 0.98
    config.optim.warmup_steps = 24_000
    config.optim.grad_accum_steps = 1  # raise it when 8192 x 512 does not fit the devices
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return config
