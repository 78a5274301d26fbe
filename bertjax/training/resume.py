"""The train state a run starts from: the newest checkpoint that reads (made whole by the
objective), or a fresh state the objective prepares; and the meta saved beside each checkpoint."""

from __future__ import annotations

import logging

import jax

from bertjax.data import plan_version
from bertjax.interop.checkpoints import tokenizer_meta
from bertjax.objectives.warm_start import warm_start
from bertjax.retry import Retryable
from bertjax.training import phases as phases_lib
from bertjax.training import step as step_lib
from bertjax.training.checkpoint import Checkpointer, check_compatible


def checkpoint_meta(config, model_cfg, data) -> dict:
    return {
        "config": config.to_dict(),
        "model_config": model_cfg.to_dict(),
        "data_fingerprint": data.fingerprint,
        **({} if data.plan_version is None else {plan_version.KEY: data.plan_version}),
        **tokenizer_meta(data.tokenizer),
    }


class EarlierCheckpoint(Retryable):
    """The newest readable checkpoint is older than the one the run planned from (a newer one
    was unreadable and was set aside): the run is planned again from it."""

    def __init__(self, step: int):
        super().__init__(
            f"a newer checkpoint could not be read and was set aside (see the warning above); "
            f"the newest that reads is step {step}: rerun the same command (it resumes there)"
        )
        self.step = step


def restore_or_init(
    config, objective, data, model_cfg, mesh, ckpt: Checkpointer, phase=None, planned=None
):
    """The train state: the latest checkpoint in ``ckpt`` if there is one (made whole by the
    objective: a teacher reloaded), else a fresh state prepared by the objective (the MLM bias,
    a pretrained encoder, a distillation teacher). A later ``phase`` (bertjax/training/
    phases.py) starts from the previous phase's last checkpoint; with reset_time its schedule
    counts restart at the phase's first step. ``planned``: the step the run was planned from
    (phases, JAX's sync point): resuming from another raises `EarlierCheckpoint`."""
    abstract, shardings, init_fn = step_lib.abstract_train_state(config, model_cfg, mesh)

    def fresh():
        options = step_lib.compiler_options(config)
        init = jax.jit(init_fn, out_shardings=shardings, compiler_options=options)
        return init(jax.random.key(config.seed))

    if ckpt.latest_step() is not None:
        fingerprint = data.tokenizer.fingerprint()

        def check(meta):
            check_compatible(meta, model_cfg, fingerprint, ckpt.directory)
            if data.plan_version is not None:
                allow = bool(config.get("data", {}).get("allow_plan_change", False))
                plan_version.check(meta, data.plan_version, allow, ckpt.directory)

        state, meta = ckpt.restore_newest(abstract, check)
        if planned is not None and int(state.step) != planned:
            raise EarlierCheckpoint(int(state.step))  # a newer one was unreadable: replan
        state = objective.resume_state(state, data, fresh)
        data.check_resume(meta.get("config", {}), int(state.step))
        logging.warning("resumed from step %d in %s", int(state.step), ckpt.directory)
        if phase is not None and phase.index and phase.reset_time and state.step == phase.start:
            logging.info(
                "phase %r starts at step %d: its schedule restarts", phase.name, phase.start
            )
            state = state.replace(opt_state=phases_lib.restart_schedule(state.opt_state))
        return state
    if phase is not None and phase.index:
        raise ValueError(
            f"phase {phase.name!r} starts from the previous phase's last checkpoint, but "
            f"{ckpt.directory} has none"
        )
    state = objective.prepare_state(fresh(), data)
    if config.get("init_from") and not objective.loads_init_from:  # pretraining from a model
        state = warm_start(state, config.init_from, model_cfg, bool(config.get("init_tiling")))
    return state
