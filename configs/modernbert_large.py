"""ModernBERT-large (Warner et al. 2024): modernbert_base's three phases at the large sizes, as
its training configs give them (answerdotai/ModernBERT yamls/modernbert, commit 00220af).

Differences from base: 28 layers, 1024 wide, 16 heads, GeGLU 2624; phase 1 at lr 5e-4 with the
batch growing from 448 in steps of 448 to 4928 over the first 10B tokens and LR warmup over 2B;
phases 2 and 3 at lr 5e-5 and weight decay 1e-6 (batches 616 and 624). ModernBERT-large was
initialised from ModernBERT-base by centre tiling (``config.init_from`` a base checkpoint with
``config.init_tiling=True``: layer i takes base layer round(i x 22 / 28), each matrix the base
one centred and wrapped; bertjax/interop/tiling.py). The paper's large run also restarted at
5e-5 after 900B tokens (5e-4 proved too high); this recipe keeps the yamls' phase-1 value.

Data:    sample_plan="full_sentences", packed: RoBERTa's FULL-SENTENCES rows of whole sentences,
         planned per ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded
         store of any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-16 (8 chips, as the paper's 8 H100s; batches 4928, 616, 624 split 8 ways, in
         14, 11 and 13 microbatches: 21-38% of HBM free)
         check it: python -m bertjax.compile --config=configs/modernbert_large.py --topology=v5p-16
                   --quick (the unrolled 28 layers take the better part of an hour on a laptop)
Run:     python train.py --config=configs/modernbert_large.py --workdir=gs://BUCKET/mb_large \
             --config.data.corpus='/data/*.txt' \
             --config.data.hf_vocab=/models/ModernBERT-base/tokenizer.json \
             --config.init_from=gs://BUCKET/modernbert --config.init_tiling=True
Expect:  the paper's ModernBERT-large: GLUE 90.4. Not reproduced here (no accelerator); the tests
         run this recipe shrunk.
"""

import os

from bertjax.trainer import load_config_file, model_config_dict, recipe_variant

BILLION = 1_000_000_000


def get_config(variant=""):
    config = load_config_file(os.path.join(os.path.dirname(__file__), "modernbert_base.py"))
    config.model = model_config_dict(
        "modernbert-large", dtype="bfloat16", rope_theta=10000.0, local_rope_theta=10000.0
    )
    config.init_tiling = True  # from a ModernBERT-base checkpoint named by --config.init_from
    config.batch_size = 4928
    config.batch_warmup.tokens = 10 * BILLION
    config.batch_warmup.quantum = 448
    config.optim.learning_rate = 5e-4
    config.optim.base_batch_size = 4928
    config.optim.warmup_tokens = 2 * BILLION
    # Microbatches: the whole batch at once needs 308 / 495 / 462 GiB per chip on v5p-16
    # (bertjax.compile --quick); each must divide every step's rows per chip (phase 1: 56 x j
    # during the batch warmup, 616 after; 77; 78).
    config.optim.grad_accum_steps = 14  # phase 1: 44 rows x 1024 per chip a microbatch
    for name, batch, microbatches in (("extend", 616, 11), ("decay", 624, 13)):
        config.phases[name].set.batch_size = batch
        config.phases[name].set.optim.grad_accum_steps = microbatches  # 7 and 6 rows x 8192
        config.phases[name].set.optim.learning_rate = 5e-5
        config.phases[name].set.optim.weight_decay = 1e-6
    # 7 rows x 8192 a microbatch left 10% of HBM free (77 rows per chip split only 7 or 11 ways):
    # the extension phase keeps only the matmuls' outputs for the backward pass
    config.phases.extend.set.model = {"remat": "dots"}
    return recipe_variant(config, variant)
