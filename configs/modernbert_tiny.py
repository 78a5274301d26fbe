"""ModernBERT-tiny on the built-in corpus: the ModernBERT shape (RoPE, GeGLU, bias-free pre-norm
layers, alternating local/global attention) at BERT-tiny's width, with bert_tiny's tokenizer,
data, masking and evaluation, MLM only.

Run:     python train.py --config=configs/modernbert_tiny.py --workdir=workdir/modernbert_tiny
Expect:  see docs/results/comparisons.md ("ModernBERT-tiny vs BERT-tiny at equal wall time") for the
         held-out MLM accuracy at 1, 2 and 4 minutes beside the default run.
"""

import os

from bertjax.trainer import load_config_file, model_config_dict, recipe_variant


def get_config(variant=""):
    config = load_config_file(os.path.join(os.path.dirname(__file__), "bert_tiny.py"))
    # 4 layers of width 128 (2 heads), GLU halves of 256: about BERT-tiny's parameters per token
    # outside the embeddings in twice the depth (ModernBERT's deep-and-narrow choice).
    config.model = model_config_dict(
        "modernbert-tiny",
        intermediate_size=256,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,  # short runs underfit (as bert_tiny)
        local_attention_window=64,  # a local layer sees +-32 tokens of a 128-token row
        global_attn_every_n_layers=2,  # layers 0 and 2 global, 1 and 3 local
        rope_theta=10000.0,  # ModernBERT's 1024-token phase: 10k for both layer kinds
        local_rope_theta=10000.0,
    )
    config.data.sample_plan = "full_sentences"  # no NSP (ModernBERT: MLM only)
    config.optim.b2 = 0.98  # ModernBERT's betas and eps
    config.optim.eps = 1e-6
    return recipe_variant(config, variant)
