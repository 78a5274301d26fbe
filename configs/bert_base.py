"""BERT-base (Devlin et al. 2019) pretraining as BERT did: MLM + NSP, 1M steps at batch 256, the
first 90% at 128 tokens (20 predictions), the last 10% at 512 (76), one linear schedule over both
(AdamW 1e-4, 10k warmup steps; google-research/bert README and paper §A.2).

Data:    sample_plan="nsp": BERT's sentence pairs with NSP labels (the paper's input), planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-16 (BERT-base trained on 16 TPU chips, 4 Cloud TPUs)
         check it: python -m bertjax.compile --config=configs/bert_base.py --topology=v5e-16
Run:     python train.py --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base \
             --config.data.corpus='/data/wiki/*.txt'
Expect:  900k steps at 256 x 128 then 100k at 256 x 512 (phase "seq512" continues the schedule:
         reset_time=False); on one TPU v4-8 or 8 GPUs in bf16 about 3-5 days; MLM accuracy
         ~0.65-0.70 on English Wikipedia+books. On the built-in corpus it runs but the corpus is
         far too small for this model. max_predictions at 512: the README's rule
         max_seq_length x masked_lm_prob (76.8, floored; NVIDIA's recipe uses 80).
"""

from bertjax.trainer import default_run_config, model_config_dict, phase, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 1_000_000  # both phases (the schedule's span)
    config.data.vocab_size = 30522
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.sample_plan = "nsp"
    config.optim.name = "adamw"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.optim.weight_decay = 0.01
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    config.phase_order = ("seq128", "seq512")
    # one linear decay over all 1M steps: the first phase's schedule spans both
    config.optim.total_steps = 1_000_000
    config.phases.seq128 = phase(steps=900_000, optim={"total_steps": 1_000_000})
    config.phases.seq512 = phase(
        steps=100_000,
        reset_time=False,  # the same schedule runs on (its count is not restarted)
        data={"max_seq_length": 512, "max_predictions": 76},
    )
    return recipe_variant(config, variant)
