"""The pure training step: the public face of `bertjax.training.step`.

state = step.init_train_state(config, model_cfg, mesh, jax.random.key(0))
train, evaluate = step.jit_steps(state, mesh)   # step.FAST_COMPILE as 3rd argument: XLA -O0
state, metrics = train(state, batch, rng)
"""

from bertjax.training.step import (
    FAST_COMPILE,
    Steps,
    StepSpec,
    TrainState,
    abstract_train_state,
    compiler_options,
    default_step_config,
    eval_step,
    init_train_state,
    jit_steps,
    train_step,
)

__all__ = [
    "FAST_COMPILE",
    "StepSpec",
    "Steps",
    "TrainState",
    "abstract_train_state",
    "compiler_options",
    "default_step_config",
    "eval_step",
    "init_train_state",
    "jit_steps",
    "train_step",
]
