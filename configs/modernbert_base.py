"""ModernBERT-base (Warner et al. 2024, arXiv 2412.13663): its three phases, as its training
configs give them (answerdotai/ModernBERT yamls/modernbert, commit 00220af), with StableAdamW.

1. pretrain: 1.719T tokens at 1024, 30% masking, batch 4608 rows after a batch-size warmup from
   768 in steps of 768 over the first 50B tokens (equal steps per size; 768 = the yamls' micro
   batch of 96 x 8 GPUs), StableAdamW lr 8e-4, betas (0.9, 0.98), eps 1e-6, decoupled weight
   decay 1e-5, LR warmup over 3B tokens then constant (warmup-stable-decay without its decay),
   RoPE base 10k in global and local layers.
2. extend: 250B tokens at 8192, batch 576, lr 3e-4 constant, global RoPE base 160k (local 10k).
3. decay: 50B tokens at 8192, batch 576, 1-sqrt decay from 3e-4 over the whole phase to 0.1%.
Each phase restarts its schedule from the previous one's end (the yamls' reset_time); the
architecture is the modernbert-base preset (22 layers, 768 wide, GeGLU 1152, window 128, every
third layer global, no biases, attention-output dropout 0.1). Rows are packed (RoPE positions
restart in each document), as ModernBERT unpads.

Data:    sample_plan="full_sentences", packed: RoBERTa's FULL-SENTENCES rows of whole sentences,
         planned per ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded
         store of any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-128 (64 chips for batch 4608 x 1024; the paper used 8 H100s with accumulation)
         check it: python -m bertjax.compile --config=configs/modernbert_base.py --topology=v5p-128
Run:     python train.py --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert \
             --config.data.corpus='/data/*.txt' \
             --config.data.hf_vocab=/models/ModernBERT-base/tokenizer.json
Expect:  the paper's ModernBERT-base after all three phases (~2T tokens on 8 H100s): GLUE 88.4.
         Not reproduced here (no accelerator); the tests run this recipe shrunk.
"""

from bertjax.trainer import default_run_config, model_config_dict, phase, recipe_variant

BILLION = 1_000_000_000


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict(
        "modernbert-base", dtype="bfloat16", rope_theta=10000.0, local_rope_theta=10000.0
    )
    config.mlm_bias_init = "zeros"  # HF ModernBERT's init of the decoder bias
    config.batch_size = 4608
    config.batch_warmup.tokens = 50 * BILLION
    config.batch_warmup.quantum = 768
    config.data.hf_vocab = ""  # ModernBERT's tokenizer.json (BPE, 50368 ids with its padding)
    config.data.vocab_size = 50368  # that file's size (it brings its own): what the check compiles
    config.data.max_seq_length = 1024
    config.data.max_predictions = 320  # 30% of 1024, with margin
    config.data.mask_rate = 0.3
    config.data.eval_mask_rate = 0.15
    config.data.sample_plan = "full_sentences"
    config.data.pack_rows = True
    config.optim.name = "stableadamw"
    config.optim.learning_rate = 8e-4
    config.optim.base_batch_size = 4608
    config.optim.b1, config.optim.b2, config.optim.eps = 0.9, 0.98, 1e-6
    config.optim.weight_decay = 1e-5  # StableAdamW's decoupled decay (not multiplied by lr)
    config.optim.clip_norm = 0.0  # none in ModernBERT's yamls: StableAdamW clips per tensor
    config.optim.schedule = "constant"
    config.optim.warmup_steps, config.optim.warmup_fraction = 0, 0.0
    config.optim.warmup_tokens = 3 * BILLION
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 5_000
    long_rows = {"max_seq_length": 8192, "max_predictions": 2480}
    later = dict(
        data=long_rows,
        model={"rope_theta": 160000.0, "local_rope_theta": 10000.0},
        batch_size=576,
        batch_warmup={"tokens": 0},
    )
    config.phase_order = ("pretrain", "extend", "decay")
    config.phases.pretrain = phase(tokens=1_719 * BILLION)
    config.phases.extend = phase(
        tokens=250 * BILLION, optim={"learning_rate": 3e-4, "warmup_tokens": 0}, **later
    )
    config.phases.decay = phase(
        tokens=50 * BILLION,
        optim={
            "learning_rate": 3e-4,
            "warmup_tokens": 0,
            "schedule": "1-sqrt",
            "end_lr_fraction": 0.001,
        },
        **later,
    )
    return recipe_variant(config, variant)
