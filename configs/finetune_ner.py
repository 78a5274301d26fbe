"""Fine-tune BERT-tiny for token classification (BIO tags, first-piece labelling): by default the
built-in, offline `stdlib_code_spans` (CPython docstring words tagged by rule: CODE spans of
dotted/snake_case/call words, EXC exception names). CoNLL-style data: --config.task.source=files
--config.task.train_file=train.conll --config.task.dev_file=dev.conll (word ... tag per line).

Run:     python train.py --config=configs/finetune_ner.py --workdir=workdir/ft_ner \
             --config.init_from=workdir/bert_tiny
Expect:  about 5 minutes on a 2-core CPU; from the 1500-step /tmp/default_run encoder (lr 5e-4,
         600 steps) dev entity-level F1 0.58 (precision 0.66, recall 0.52; only ~2% of words are
         entities, token accuracy 0.986); the best checkpoint and dev predictions are in
         workdir/ft_ner/best/.
"""

from bertjax.objectives.finetune import add_finetune_config
from bertjax.trainer import default_run_config, recipe_variant


def get_config(variant=""):
    config = add_finetune_config(default_run_config(), "token_classification", num_labels=4)
    config.task.source = "builtin:stdlib_code_spans"
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 600
    config.data.max_seq_length = 64
    config.data.vocab_size = 4000  # tokenizer trained on the task's text when init_from is ""
    # BERT-tiny: 5e-4 beat 1e-4 from both inits on stdlib_families
    config.optim.learning_rate = 5e-4
    config.optim.base_batch_size = 32
    config.optim.warmup_fraction = 0.1
    config.optim.layerwise_lr_decay = 0.9
    config.loss.fgm_epsilon = 0.0  # FGM on the word embeddings (0 = off)
    config.log_every = 50
    config.eval_every = 100
    config.checkpoint_every = 0
    config.keep_checkpoints = 1
    return recipe_variant(config, variant)
