"""GLUE: CoLA, SST-2, MRPC, STS-B, QQP, MNLI (m/mm), QNLI, RTE from one encoder, BERT's recipe
(batch 32, 3 epochs, warmup 10%, peak LR in {2,3,4,5}e-5, no LLRD), 3 seeds per LR, the best
LR per task by the median dev score over seeds (bertjax/evaluation/glue.py); each run reports its
dev scores at the end of training (config.glue.report "last"; "best_on_dev": early stopping on
dev, not comparable with the published numbers below).

Run:     python -m bertjax.glue --workdir=workdir/glue \
             --config.init_from=workdir/bert_base     # a bertjax workdir or a Hugging Face dir
         (the tasks: nyu-mll/glue's parquet on the Hugging Face Hub at a pinned commit,
         config.task.glue_revision, downloaded once into the Hugging Face cache; offline:
         --glue_dir=glue_data, the folders of the standard download_glue_data.py, or
         --glue_source=tfds, prepared TFDS glue/*). Per task: --config.glue.rte.epochs=10
         --config.glue.rte.learning_rates='(1e-5, 2e-5)'; RoBERTa's MNLI start for the small
         tasks: --config.glue.from_mnli='("rte", "mrpc", "stsb")'. A second call with the same
         --workdir skips every finished run. Through train.py this recipe fine-tunes the built-in
         `stdlib_word_order` task once (a CoLA-like check that needs no GLUE data).
Expect:  OUT/glue_results.json, glue_results.md and glue_runs.json: 8 tasks x 4 LRs x 3 seeds =
         96 runs; MNLI (393k pairs, ~36.8k steps a run) and QQP (364k) are most of the cost.
         Published bert_base-size numbers, each with the metric its source reports (bertjax's
         task `score` averages both metrics of MRPC, QQP, STS-B and MNLI, as the leaderboard
         does, so compare metric by metric):
         - BERT-base, Devlin et al. 2019, Table 1, GLUE *test* server: MNLI-m/mm 84.6/83.4 (acc),
           QQP 71.2 (F1), QNLI 90.5 (acc), SST-2 93.5 (acc), CoLA 52.1 (Matthews), STS-B 85.8
           (Spearman), MRPC 88.9 (F1), RTE 66.4 (acc); average 79.6. Test labels are private:
           dev scores run higher on QQP (accuracy ~90 vs test F1 71) and CoLA.
         - bert-base-cased, transformers' text-classification README (dev, one run, lr 2e-5,
           3 epochs; MRPC 5): CoLA 56.53 (Matthews), SST-2 92.32, MRPC 88.85/84.07 (F1/acc),
           STS-B 88.64/88.48 (Pearson/Spearman), QQP 90.71/87.49 (acc/F1), MNLI 83.91/84.10
           (m/mm acc), QNLI 90.66, RTE 65.70.
         - RoBERTa-base, fairseq's RoBERTa README (dev, single-task fine-tuning): MNLI 87.6,
           QNLI 92.8, QQP 91.9, RTE 78.7, SST-2 94.8, MRPC 90.2, CoLA 63.6, STS-B 91.2 (the README
           names no metric per task).
         - ELECTRA-Base, google-research/electra README (dev, median over many seeds, as here):
           CoLA 67.7 (Matthews), SST-2 95.1, MRPC 89.5 (acc), STS-B 91.2 (Spearman), QQP 91.5
           (acc), MNLI 88.8 (acc), QNLI 93.2, RTE 82.7.
"""

from bertjax.evaluation.glue import default_glue_config
from bertjax.objectives.finetune import add_finetune_config
from bertjax.trainer import default_run_config, recipe_variant


def get_config(variant=""):
    config = add_finetune_config(default_run_config(), "classification", num_labels=2)
    config.glue = default_glue_config()  # tasks, LR grid, seeds, per-task hyper-parameters
    # train.py runs (not the harness, which sets each GLUE task): the built-in word-order task
    config.task.source = "builtin:stdlib_word_order"
    config.seed = 0
    config.batch_size = 32  # the harness uses config.glue.batch_size (or the task's own)
    config.num_train_steps = 600  # the harness sets it from config.glue.epochs
    config.data.max_seq_length = 128  # [CLS] a [SEP] b [SEP], cut longest-first (BERT: 128)
    config.data.vocab_size = 8000  # without init_from: SentencePiece trained on each task's text
    config.optim.learning_rate = 5e-5  # the harness uses config.glue.learning_rates
    config.optim.lr_scaling = "none"  # the LR grid is for the batch as set
    config.optim.weight_decay = 0.01
    config.optim.layerwise_lr_decay = 1.0  # the harness uses config.glue.layerwise_lr_decay
    config.log_every = 100
    config.eval_every = 100  # the harness evaluates config.glue.evals_per_epoch times an epoch
    config.checkpoint_every = 0  # only at the end (and on SIGTERM: a stopped run resumes)
    config.keep_checkpoints = 1
    return recipe_variant(config, variant)
