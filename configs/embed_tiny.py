"""Embedding fine-tuning of BERT-tiny on the built-in pairs (a docstring's first sentence against
the rest of it; a documentation heading against its section), no download: InfoNCE over the
global batch's documents with one hard negative per query (another docstring of the same
module), mean pooling, scale 20 (sentence-transformers' MultipleNegativesRankingLoss default).

Run:     python train.py --config=configs/embed_tiny.py --workdir=workdir/embed_tiny
         python train.py --config=configs/embed_tiny.py --workdir=workdir/embed_ft \
             --config.init_from=workdir/bert_tiny
Expect:  6 min of CPU time (16 min wall on a 2-core CPU shared with other jobs); the held-out
         retrieval metrics (209 held-out queries against their 209 documents) print at each
         eval: measured from random init, seed 0 (docs/results/comparisons.md, 2026-12-02): step 250
         ndcg@10 0.519, mrr@10 0.481, recall@100 0.947; step 500 ndcg@10 0.544, mrr@10 0.511,
         recall@100 0.952.
"""

from bertjax.objectives.embedding import add_embedding_config
from bertjax.trainer import default_run_config, recipe_variant


def get_config(variant=""):
    config = add_embedding_config(default_run_config())
    config.seed = 0
    config.batch_size = 64  # queries per step; each sees 64 x 2 candidate documents
    config.num_train_steps = 500
    config.data.max_seq_length = 96  # document rows (queries: config.pairs.max_query_length)
    config.data.vocab_size = 4000  # tokenizer trained on the pairs when init_from is ""
    config.pairs.num_negatives = 1  # one hard negative per query
    config.pairs.max_query_length = 32
    config.loss.scale = 20.0
    config.optim.learning_rate = 5e-4
    config.optim.base_batch_size = 64
    config.optim.warmup_fraction = 0.1
    config.optim.weight_decay = 0.01
    config.log_every = 50
    config.eval_every = 250
    config.checkpoint_every = 0
    config.keep_checkpoints = 1
    return recipe_variant(config, variant)
