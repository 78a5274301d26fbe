"""BERT-large with BERT's two length phases: 90% of steps at 128 tokens, then 512.

Data:    sample_plan="nsp": BERT's sentence pairs with NSP labels (the paper's input), planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-64 (BERT-large trained on 64 TPU chips)
         check it: python -m bertjax.compile --config=configs/bert_large.py --topology=v5e-64
Run:     python train.py --config=configs/bert_large.py --workdir=DIR \
             --config.data.corpus='/data/*.txt'
Expect:  each phase compiles once (the length of every step is known ahead); MLM accuracy
         ~0.70 after 1M steps at batch 256 on Wikipedia+books. Use --config.mesh.fsdp=N
         to shard the 340M parameters and optimizer state when memory is short.
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("large", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.batch_size = 256
    config.num_train_steps = 1_000_000
    config.data.vocab_size = 30522
    config.data.max_seq_length = 512
    config.data.length_schedule = ((0.9, 128), (0.1, 512))  # phases, in this order
    config.data.max_predictions = 80  # 15% of 512 plus margin; rows at 128 pad the rest
    config.data.sample_plan = "nsp"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
