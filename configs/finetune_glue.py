"""Fine-tune BERT-tiny on a sequence task: by default the built-in, offline `stdlib_families`
(CPython docstring sentences labelled by their module's library family: text / files / network /
concurrency; dev = 20% of documents). GLUE: --config.task.source=glue:sst2
--config.loss.num_labels=2 (nyu-mll/glue's parquet from the Hub at a pinned commit, downloaded
once into the Hugging Face cache; --config.task.glue_dir=DIR for the download script's folders)
or tfds:glue/sst2 (prepared ArrayRecord data, nothing is downloaded); files:
--config.task.source=files --config.task.train_file=train.tsv --config.task.dev_file=dev.tsv
(text, [text_pair], label columns); STS-B style regression: --config.loss.num_labels=1
--config.task.metric=pearson.

Run:     python train.py --config=configs/bert_tiny.py --workdir=workdir/bert_tiny
         python train.py --config=configs/finetune_glue.py --workdir=workdir/ft_glue \
             --config.init_from=workdir/bert_tiny
Expect:  about 5 minutes on a 2-core CPU; dev accuracy about 0.75-0.78 (majority class 0.315).
         Measured (benchmarks/comparisons/finetune_compare.py, 600 steps, this LR, median of 3
         seeds):
         0.758 from the default job's encoder, 0.765 from a random init (a bag-of-words task).
         The built-in word-order task (--config.task.source=builtin:stdlib_word_order
         --config.loss.num_labels=2) needs the pretrained encoder: 0.708 vs 0.514 from a random
         init (majority 0.514; docs/results/comparisons.md). The best checkpoint and its dev
         predictions are in workdir/ft_glue/best/.
"""

from bertjax.objectives.finetune import add_finetune_config
from bertjax.trainer import default_run_config, recipe_variant


def get_config(variant=""):
    config = add_finetune_config(default_run_config(), "classification", num_labels=4)
    config.task.source = "builtin:stdlib_families"
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 600
    config.data.max_seq_length = 64  # task rows: [CLS] a [SEP] (b [SEP]), cut longest-first
    config.data.vocab_size = 4000  # tokenizer trained on the task's text when init_from is ""
    # BERT-tiny: 5e-4 beat 1e-4 from both inits on stdlib_families
    config.optim.learning_rate = 5e-4
    config.optim.base_batch_size = 32
    config.optim.lr_scaling = "linear"  # LR follows batch_size / base_batch_size
    config.optim.warmup_fraction = 0.1
    # classifier 1.0, top layer 0.9, ..., embeddings 0.9^(L+1)
    config.optim.layerwise_lr_decay = 0.9
    config.optim.weight_decay = 0.01
    config.loss.fgm_epsilon = 0.0  # e.g. 1.0 for FGM adversarial training (twice the step cost)
    config.log_every = 50
    config.eval_every = 100
    config.checkpoint_every = 0
    config.keep_checkpoints = 1
    return recipe_variant(config, variant)
