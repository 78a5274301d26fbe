"""Cramming (Geiping & Goldstein 2023, "Cramming: Training a Language Model on a Single GPU in One
Day"; JonasGeiping/cramming, arch=crammed-bert train=bert-o4 data=pile-readymade): a BERT-base
-sized pre-LN encoder trained on a fixed budget.

Its architecture as config fields: 16 layers, 768 wide, 12 heads, a gated-GELU feed-forward of
2 x 1536 (cramming's intermed_size 3072 split in halves), pre-LN with a final norm and LayerNorm
eps 1e-12, no biases in the dense layers, Q/K/V or the decoder, tied decoder, no dropout in
pretraining, MLM only at 25% masking over 128-token rows (WordPiece vocab 32768). Its recipe:
AdamW lr 1e-3, betas (0.9, 0.98), eps 1e-12, weight decay 0.01, gradient clipping 0.5, batch
8192 reached by a ramp at 60% of the budget, and the "budget-triangle2" schedule
lr = peak x min(0.25 + x, 4 (1 - x)) over the budget fraction x; the ramp and the triangle share
that clock (here the fraction of the budget's tokens, optim.schedule_clock "tokens"), so the LR
peaks at 75% of the tokens while the small early batches are most of the steps.

Deviations, each deliberate: the budget is counted in training FLOPs (config.budget_flops, the
trainer's count) instead of 24 hours of wall time, and the batch ramp in tokens
(batch_warmup.shape "equal_tokens": the batch grows in proportion to the tokens consumed, in
multiples of 256), so that a run stays a pure function of its config and resumes exactly;
1.0e18 FLOPs is about a day at ~12 TFLOP/s achieved (an RTX A4000/A6000-class card at ~30-40%
of its dense peak; set it for your hardware). bertjax keeps the MLM head's transform (cramming
skips it), learned positions start sinusoidal (cramming: a fixed sinusoid times one learned
scale), and its GLU gates the first half where cramming gates the second (the same family of
functions; only pretrained weights would care).

Data:    sample_plan="full_sentences": RoBERTa's FULL-SENTENCES rows of whole sentences, planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-8 (the paper: one GPU for a day); the batch of 8192 is 8 microbatches
         (config.optim.grad_accum_steps; cramming's micro-batch is 128 rows per GPU, here 128 per
         chip): a step of 1024 rows per chip does not fit v5e's 16 GiB (docs/results/compile.md)
         check it: python -m bertjax.compile --config=configs/cramming.py --topology=v5e-8
Run:     python train.py --config=configs/cramming.py --workdir=DIR \
             --config.data.corpus='/data/pile/*.txt'
Expect:  the GLUE scores the paper reports for one GPU-day; not reproduced here (no
         accelerator); the tests run this recipe shrunk.
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "base",
        dtype="bfloat16",
        num_hidden_layers=16,
        intermediate_size=1536,
        mlp_type="glu",
        pre_layer_norm=True,
        layer_norm_eps=1e-12,
        attention_bias=False,
        mlp_bias=False,
        head_bias=False,
        decoder_bias=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        position_embedding_init="sinusoidal",
        max_position_embeddings=128,
    )
    config.mlm_bias_init = "zeros"
    config.budget_flops = 1.0e18  # the budget (see the docstring); it sets num_train_steps
    config.batch_size = 8192
    config.batch_warmup.quantum = 256
    config.batch_warmup.shape = "equal_tokens"
    config.batch_warmup.budget_fraction = 0.6  # the batch reaches 8192 at 60% of the budget
    config.data.vocab_size = 32768
    config.data.max_seq_length = 128
    config.data.max_predictions = 36  # 25% of 128, with margin
    config.data.mask_rate = 0.25
    config.data.eval_mask_rate = 0.15
    config.data.sample_plan = "full_sentences"
    config.optim.name = "adamw"
    config.optim.learning_rate = 1e-3
    config.optim.base_batch_size = 8192
    config.optim.b1, config.optim.b2, config.optim.eps = 0.9, 0.98, 1e-12
    config.optim.weight_decay = 0.01
    config.optim.clip_norm = 0.5
    config.optim.grad_accum_steps = 8  # 128 rows per chip per microbatch on v5e-8 (Slice:)
    config.optim.schedule = "triangle"
    config.optim.schedule_clock = "tokens"  # x = elapsed budget (tokens), the batch ramp's clock
    config.optim.warmup_steps, config.optim.warmup_fraction = 0, 0.0
    config.log_every = 100
    config.eval_every = 5_000
    config.checkpoint_every = 5_000
    return recipe_variant(config, variant)
