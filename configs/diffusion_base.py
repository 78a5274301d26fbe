"""Masked diffusion LM (LLaDA/MDLM) with a BERT-base-sized encoder, for accelerators.

Data:    sample_plan="full_sentences": RoBERTa's FULL-SENTENCES rows of whole sentences, planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-16 (16 chips for batch 256 x 512)
         check it: python -m bertjax.compile --config=configs/diffusion_base.py --topology=v5e-16
Run:     python train.py --config=configs/diffusion_base.py --workdir=DIR \
             --config.data.corpus='/data/*.txt'
         python -m bertjax.diffusion --workdir=DIR --prompt="..." --answer_length=64 \
             --steps=64 --block_length=16
Expect:  LLaDA's recipe at BERT-base size: pre-LN, no token types, AdamW 4e-4 with warmup, bf16;
         eval/nll_bound (nats/token, an upper bound on the NLL) falls steadily below the unigram
         entropy within the first thousand steps and keeps falling; samples become fluent later
         than an autoregressive model of the same size.
"""

from bertjax.diffusion import add_diffusion_config
from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "base",
        type_vocab_size=1,
        pre_layer_norm=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        dtype="bfloat16",
    )
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 200_000
    config.data.vocab_size = 32000
    config.data.tokenizer_type = "bpe"
    config.data.max_seq_length = 512
    # objective, masking (t ~ U(eps, 1) per row, every position listed) and FULL-SENTENCES rows
    add_diffusion_config(config)
    config.optim.learning_rate = 4e-4
    config.optim.base_batch_size = 256
    config.optim.b2 = 0.95
    config.optim.weight_decay = 0.1
    config.optim.schedule = "wsd"  # LLaDA: warmup, constant, then linear decay
    config.optim.warmup_steps = 2000
    config.log_every = 100
    config.eval_every = 5000
    config.eval_batches = 32
    config.checkpoint_every = 5000
    return recipe_variant(config, variant)
