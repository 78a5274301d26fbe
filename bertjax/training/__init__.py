"""Running the encoder: the pure step and everything around the loop.

step         TrainState, train_step / eval_step (pure, jitted once with shardings)
optim        AdamW / LAMB / Adafactor / StableAdamW (stable_adamw), schedules (linear, cosine,
             WSD, 1-sqrt, cramming's triangle), LR scaling
param_groups which parameters decay, stacked layer/expert axes, layer-wise LR decay factors
phases       multi-phase runs from one config; FLOP budgets
sharding     the device mesh, logical-axis rules, global batches
checkpoint   Orbax checkpoints with exact resume (best: WORKDIR/best by a dev metric)
run_config   the run config's keys and defaults, recipe files
trainer      train_and_evaluate: the loop, logging, evaluation and checkpoint cadence
metrics      model FLOPs and MFU
trackers     where metrics go: TensorBoard, metrics.jsonl, W&B (wandb_tracker); run_record: the
             run's id and hardware (WORKDIR/run.json)
profiling    a jax.profiler trace of chosen steps (config.profile)
runtime      process settings applied at start (glibc malloc on huge pages)
processes    several JAX processes as one run: joining, configs compared, host numbers summed,
             a lost process named
stopping     a stop request (SIGTERM/SIGINT to any process) at one step on every process
"""
