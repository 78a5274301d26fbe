"""A ModernBERT-base embedding model in nomic's two stages (nomic-ai/contrastors; Nussbaum et al.
2024 for the recipe, modernbert-embed-base for its ModernBERT form), as two phases of one run:

1. weak: contrastive training on weakly supervised pairs at a very large batch (16,384 queries,
   each scored against every document of the global batch), which GradCache makes fit: the
   encoder runs 4,096 queries (and their documents) at a time, 64 per chip on the slice below
   (fewer chips: a smaller chunk). Fewer, larger chunks keep the chips' matrix units busy and
   reduce less across chips (docs/results/compile.md).
2. hard: fine-tuning at batch 256 with 7 mined hard negatives per query and Matryoshka losses at
   768 and 256 dimensions.

Both stages: mean pooling, L2-normalized outputs, cosine similarity. The batch sizes, the hard
negatives and the Matryoshka widths are the recipe's; the learning rates, warmup, lengths and the
scale (50 = temperature 0.02, BGE's) are bertjax's choices here, not taken from nomic's configs.
The pairs are not shipped: name them per phase (JSONL or Parquet with query / positive /
negatives fields, local or gs://); the defaults are the built-in pairs so the recipe runs as is.

Slice:   v5p-128 (64 chips for contrastive batch 16384)
         check it: python -m bertjax.compile --topology=v5p-128 \\
             --config=configs/embed_modernbert_base.py
Run:     python train.py --config=configs/embed_modernbert_base.py --workdir=gs://BUCKET/embed \
             --config.init_from=/models/ModernBERT-base \
             --config.phases.weak.set.pairs.source=gs://BUCKET/pairs/weak.parquet \
             --config.phases.hard.set.pairs.source=gs://BUCKET/pairs/hard_negatives.jsonl
         python -m bertjax.embed --model=gs://BUCKET/embed --export=modernbert-embed/
Expect:  a sentence-transformers model after both phases (nomic reports BEIR NDCG@10 near 52 for
         modernbert-embed-base); not reproduced here (no accelerator, no pair data); the tests run
         this recipe shrunk.
"""

from bertjax.objectives.embedding import add_embedding_config
from bertjax.trainer import default_run_config, model_config_dict, phase, recipe_variant


def get_config(variant=""):
    config = add_embedding_config(default_run_config())
    # the model of init_from (an HF ModernBERT dir) wins; this shape serves a random init
    config.model = model_config_dict("modernbert-base", dtype="bfloat16")
    config.batch_size = 16384
    config.data.vocab_size = 50368  # ModernBERT's (init_from brings its tokenizer): the check's
    config.data.max_seq_length = 512  # document rows
    config.pairs.max_query_length = 64
    config.loss.pooling = "mean"
    config.loss.normalize = True
    config.loss.scale = 50.0
    config.optim.name = "adamw"
    config.optim.weight_decay = 0.01
    config.optim.warmup_fraction = 0.05
    config.optim.base_batch_size = 16384
    config.log_every = 10
    config.eval_every = 500
    config.checkpoint_every = 500
    config.phase_order = ("weak", "hard")
    config.phases.weak = phase(
        steps=10_000,
        pairs={"source": "builtin", "num_negatives": 0},
        loss={"gradcache_chunk_size": 4096},
        optim={"learning_rate": 2e-4},
    )
    config.phases.hard = phase(
        steps=1_000,
        batch_size=256,
        pairs={"source": "builtin", "num_negatives": 7},
        loss={"gradcache_chunk_size": 0, "matryoshka_dims": (768, 256)},
        optim={"learning_rate": 2e-5, "base_batch_size": 256},
    )
    return recipe_variant(config, variant)
