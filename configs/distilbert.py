"""DistilBERT-style distillation of the BERT-tiny default (configs/bert_tiny.py) into a 1-layer
student.

Data:    sample_plan="nsp": BERT's sentence pairs with NSP labels (the paper's input), planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-4 (4 chips; DistilBERT trained on 8 V100s)
         check it: python -m bertjax.compile --config=configs/distilbert.py --topology=v5e-4
Run:     python train.py --config=configs/bert_tiny.py --workdir=workdir/bert_tiny   # the teacher
         python train.py --config=configs/distilbert.py --workdir=workdir/distilbert \
             --config.loss.teacher=workdir/bert_tiny
Expect:  from the BERT-tiny teacher (3000 steps, held-out MLM accuracy 0.346), held-out MLM
         accuracy 0.308 (0.303-0.314 over seeds 0-2) after 300 steps, vs 0.083 (0.078-0.087)
         for the same 1-layer student trained from random init without a teacher
         (benchmarks/comparisons/distill_compare.py; docs/results/comparisons.md). The KL at every
         real token (HF's default) runs ~2 steps/s on a 2-core CPU; at masked positions only
         (restrict_ce_to_mask) ~6 steps/s at 0.304 (0.297-0.311): at this size it buys nothing
         measurable. With the default empty config.loss.teacher the teacher is RANDOM: a smoke test
         only.
"""

from bertjax.objectives.distill import add_distill_config
from bertjax.trainer import default_run_config, recipe_variant


def get_config(variant=""):
    config = add_distill_config(default_run_config())
    config.seed = 0
    config.batch_size = 32
    config.num_train_steps = 500
    config.model.num_hidden_layers = 1  # the student; width, heads, vocab follow the teacher's
    # () = teacher layers spread first to last, as HF's extract_distilbert (BERT-tiny's 2 -> 1
    # takes layer 0; a 12-layer teacher's 6-layer student would take 0,2,4,7,9,11)
    config.loss.student_layers = ()
    config.loss.restrict_ce_to_mask = False  # soft-target KL at every real token (HF's default)
    config.data.vocab_size = 8000  # unused when a bertjax teacher brings its tokenizer
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.sample_plan = "nsp"  # the teacher's input distribution; NSP labels unused
    # HF's distiller picks tokens to predict with P proportional to max(count, 1) ** -0.7
    config.data.mask_token_weighting = "smoothed_unigram"
    config.data.mask_token_smoothing = 0.7  # HF distillation train.py --mlm_smoothing
    config.optim.learning_rate = 1e-3
    config.optim.base_batch_size = 32
    config.optim.warmup_steps = 50
    config.optim.weight_decay = 0.01
    config.log_every = 50
    config.eval_every = 250
    config.eval_batches = 16
    config.checkpoint_every = 250
    return recipe_variant(config, variant)
