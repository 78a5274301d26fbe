"""The pure pretraining step: train state, `train_step`, `eval_step`, and their jitted forms.

`train_step(state, batch, rng)` and `eval_step(state, batch)` are pure functions of
pytrees; everything static (model config, loss weights, optimizer) rides in the
state's non-pytree fields, so one jit serves every step. `jit_steps` binds them to a
mesh with shardings and donation. Metrics stay on device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import struct
from jax.sharding import Mesh, PartitionSpec

from bertjax import objectives
from bertjax.data.plans.batch_plan import BatchPlan
from bertjax.modeling.bert_config import BertConfig
from bertjax.training import optim, sharding

Array = jax.Array


def default_step_config() -> ml_collections.ConfigDict:
    """Run-level pieces the step needs; the trainer adds data, eval and checkpoint fields."""
    c = ml_collections.ConfigDict()
    c.batch_size = 256  # global batch size (all hosts, all microbatches)
    c.seed = 0  # seeds parameter init and dropout
    c.skip_nonfinite_updates = True  # a non-finite loss/grad leaves params and opt_state unchanged
    c.optim = optim.default_optim_config()
    c.mesh = sharding.default_mesh_config()
    c.loss = objectives.default_loss_config()
    return c


def validate_step_config(config: ml_collections.ConfigDict) -> objectives.Objective:
    """The objective of ``config``, after checking the optimizer and that its loss splits into
    the configured microbatches (from the config alone: run_config checks it before anything is
    built)."""
    optim.validate_optim_config(config.optim)
    objective = objectives.make_objective(config)
    accumulate = int(config.optim.grad_accum_steps)
    if accumulate > 1 and not objective.microbatch_additive:
        raise ValueError(
            f"config.optim.grad_accum_steps={accumulate}: the {type(objective).__name__} "
            "objective's loss is not a sum over rows (its rows interact), so microbatches "
            "cannot add up to the batch; use 1"
        )
    return objective


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static, hashable description of what a step computes."""

    model_cfg: BertConfig
    objective: objectives.Objective
    grad_accum_steps: int = 1
    skip_nonfinite_updates: bool = True

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, model_cfg: BertConfig) -> StepSpec:
        objective = validate_step_config(config)
        accumulate = int(config.optim.grad_accum_steps)
        return cls(model_cfg, objective, accumulate, bool(config.skip_nonfinite_updates))

    def model(self) -> nn.Module:
        return self.objective.model(self.model_cfg)


@struct.dataclass
class TrainState:
    """step, fp32 master params and optimizer state; static fields say how to update them."""

    step: Array
    params: Any
    opt_state: Any
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    learning_rate_fn: Callable = struct.field(pytree_node=False)
    spec: StepSpec = struct.field(pytree_node=False)
    frozen: Any = None  # params the step reads but never updates (a distillation teacher)


def abstract_train_state(
    config: ml_collections.ConfigDict, model_cfg: BertConfig, mesh: Mesh
) -> tuple[TrainState, TrainState, Callable]:
    """(state shapes, state shardings, init fn): no arrays allocated; also the restore target."""
    experts_axis = dict(mesh.shape).get("expert", 1)
    if model_cfg.num_experts and model_cfg.num_experts % experts_axis:
        raise ValueError(
            f"config.mesh.expert={experts_axis} must divide model.num_experts="
            f"{model_cfg.num_experts}: each device holds whole experts"
        )
    spec = StepSpec.from_config(config, model_cfg)
    tx, learning_rate_fn = optim.make_optimizer(
        config.optim, model_cfg, config.batch_size, **_batch_schedule(config)
    )
    model = spec.model()
    init_batch = spec.objective.init_batch(model_cfg)
    rules = sharding.logical_axis_rules()

    # The model's init is traced once: `boxed_variables` (the variables with their logical axis
    # names, for the shardings) is a jit, so the shape evaluations below and the init that
    # `init_fn`'s jit compiles reuse its trace.
    @jax.jit
    def boxed_variables(rng):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return spec.objective.init(model, {"params": rng, "dropout": rng}, init_batch)

    def init_fn(rng):
        variables = nn.unbox(boxed_variables(rng))
        params = variables["params"]
        return TrainState(
            jnp.zeros((), jnp.int32),
            params,
            tx.init(params),
            tx,
            learning_rate_fn,
            spec,
            variables.get("frozen"),
        )

    rng_shape = jax.random.key(0)
    boxed = jax.eval_shape(boxed_variables, rng_shape)
    param_shardings = sharding.logical_to_shardings(boxed["params"], mesh, rules)
    frozen_shardings = (
        sharding.logical_to_shardings(boxed["frozen"], mesh, rules)
        if boxed.get("frozen") is not None
        else None
    )
    shapes = jax.eval_shape(init_fn, rng_shape)
    everything = sharding.replicated(mesh)
    # Moments shaped like their parameter share its sharding (ZeRO-3 shards them too); other
    # state (counts, Adafactor's factored row/column statistics) is replicated.
    opt_shardings = optax.tree_map_params(
        tx,
        lambda leaf, param, param_sharding: (
            param_sharding if leaf.shape == param.shape else everything
        ),
        shapes.opt_state,
        shapes.params,
        param_shardings,
        transform_non_params=lambda _: everything,
    )
    shardings = shapes.replace(
        step=everything, params=param_shardings, opt_state=opt_shardings, frozen=frozen_shardings
    )
    shapes = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
    return shapes, shardings, init_fn


def _batch_schedule(config: ml_collections.ConfigDict) -> dict:
    """make_optimizer's ``tokens_before`` and ``tokens_at`` (tokens are rows x row length of the
    run's batch plan) and, under batch-size warmup, ``batch_at`` (the LR follows each step's
    batch)."""
    if "data" not in config:
        return {}
    length = int(config.data.max_seq_length)
    plan = BatchPlan.from_config(config, length)
    schedule = {
        "tokens_before": lambda step: plan.samples_before(step) * length,
        "tokens_at": lambda step: plan.samples_at(step) * length,
    }
    if plan.sizes:
        schedule["batch_at"] = plan.batch_at
    return schedule


def init_train_state(
    config: ml_collections.ConfigDict, model_cfg: BertConfig, mesh: Mesh, rng: Array
) -> TrainState:
    """A fresh TrainState, created directly in its shardings on ``mesh``.

    Args:
      config: the run (or step) config: ``loss`` (the objective), ``optim``, ``batch_size``.
      model_cfg: the encoder's BertConfig.
      mesh: the device mesh (`bertjax.training.sharding.make_mesh`).
      rng: the parameter-init key.

    Returns:
      A `TrainState` (step 0, params, optimizer state, a teacher in ``frozen`` if the objective
      has one), every array already placed in its sharding.
    """
    _, shardings, init_fn = abstract_train_state(config, model_cfg, mesh)
    return jax.jit(init_fn, out_shardings=shardings)(rng)


def _forward(spec: StepSpec, params, batch: dict, rng, deterministic: bool, frozen=None):
    variables = {"params": params} if frozen is None else {"params": params, "frozen": frozen}
    return spec.objective.apply(
        spec.model(), variables, batch, None if deterministic else {"dropout": rng}, deterministic
    )


def _microbatches(batch: dict, k: int) -> dict:
    """[B, ...] -> [k, B/k, ...]; microbatch i takes rows i, i+k, ... so every shard feeds each."""

    def split(x):
        if x.shape[0] % k:
            raise ValueError(
                f"config.optim.grad_accum_steps={k} does not divide the {x.shape[0]} rows of "
                "the batch (each data-parallel replica's: the batch size / dcn x data)"
            )
        x = jnp.swapaxes(x.reshape((x.shape[0] // k, k) + x.shape[1:]), 0, 1)
        names = (None, "act_batch") + (None,) * (x.ndim - 2)
        return nn.with_logical_constraint(x, names)

    return {key: split(value) for key, value in batch.items()}


def loss_function(state: TrainState, norms: dict) -> Callable:
    """``loss_fn(params, microbatch, rng) -> (loss, sums)``: what the step differentiates, one
    microbatch's share of the batch's loss (``norms``: the whole batch's normalizers)."""
    spec = state.spec
    objective = spec.objective

    def loss_fn(params, microbatch, microbatch_rng):
        outputs = _forward(
            spec, params, microbatch, microbatch_rng, deterministic=False, frozen=state.frozen
        )
        sums = objective.sums(outputs, microbatch)
        return objective.loss(sums, norms), sums

    return loss_fn


def _gradients(state: TrainState, batch: dict, rng) -> tuple[Any, dict, dict]:
    """Whole-batch gradients and loss sums, accumulated over microbatches with lax.scan."""
    spec = state.spec
    objective = spec.objective
    norms = objective.norms(batch)
    loss_fn = loss_function(state, norms)
    # e.g. FGM's second pass, or GradCache's chunked encoder runs
    grad_fn = objective.gradients(jax.grad(loss_fn, has_aux=True), spec.model())
    k = spec.grad_accum_steps
    if k == 1:
        grads, sums = grad_fn(state.params, batch, rng)
        return grads, sums, norms

    def accumulated(params, batch, rng):
        def accumulate(carry, xs):
            microbatch, index = xs
            grads, sums = grad_fn(params, microbatch, jax.random.fold_in(rng, index))
            return jax.tree.map(jnp.add, carry, (grads, sums)), None

        microbatches = _microbatches(batch, k)
        first = jax.tree.map(lambda x: x[0], microbatches)
        sums_shape = jax.eval_shape(lambda: grad_fn(params, first, rng)[1])
        zeros = (
            jax.tree.map(jnp.zeros_like, params),
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
        )
        return jax.lax.scan(accumulate, zeros, (microbatches, jnp.arange(k)))[0]

    grads, sums = _reduced_once(accumulated)(state.params, batch, rng)
    return grads, sums, norms


def _replica_axes() -> tuple[str, ...]:
    """The mesh axes (all of them) when the mesh being compiled for is data parallel only: every
    axis of more than one device is ``dcn`` or ``data``, which split the batch and replicate the
    parameters, so the gradient is a sum over them; () otherwise (FSDP, tensor or expert axes:
    the one-program loop). Manual over every axis, kernels inside need no partitioning of their
    own (cuDNN's custom partitioning fails under a partly manual mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    shape = dict(mesh.shape)
    replicas = [a for a in (sharding.DCN_AXIS, "data") if shape.get(a, 1) > 1]
    if not replicas or any(n > 1 for a, n in shape.items() if a not in replicas):
        return ()
    return tuple(mesh.axis_names)


def _without(rules: tuple, axes: tuple) -> tuple:
    """``rules`` with the mesh ``axes`` taken out (inside a shard_map manual over them)."""
    stripped = []
    for name, target in rules:
        if isinstance(target, tuple):
            target = tuple(a for a in target if a not in axes) or None
        elif target in axes:
            target = None
        stripped.append((name, target))
    return tuple(stripped)


def _reduced_once(accumulated: Callable) -> Callable:
    """``accumulated(params, batch, rng) -> (grads, sums)`` run on each replica's rows with its
    partial sums kept, then reduced across replicas once (`_replica_axes`, under shard_map):
    XLA moves the layers' reductions out of a microbatch loop but not the word table's two
    (its lookup's scatter-add and the tied decoder), which crossed the chips every microbatch.
    Each replica folds its index into the dropout key (bits per replica's rows; without
    dropout the step equals the one-program loop); cuDNN's attention dropout, which reads no
    key, seeds each device's call by its index instead (`bertjax.ops.cudnn_dropout`)."""
    axes = _replica_axes()
    if not axes:
        return accumulated
    rules = _without(sharding.logical_axis_rules(), axes)

    def local(params, batch, rng):
        rng = jax.random.fold_in(rng, jax.lax.axis_index(axes))
        with nn.logical_axis_rules(rules):
            grads, sums = accumulated(params, batch, rng)
        return jax.lax.psum((grads, sums), axes)

    replicated, rows = PartitionSpec(), PartitionSpec(axes)
    return jax.shard_map(
        local,
        in_specs=(replicated, rows, replicated),
        out_specs=replicated,
        axis_names=set(axes),
        check_vma=False,
    )


def train_step(state: TrainState, batch: dict, rng: Array) -> tuple[TrainState, dict]:
    """One optimizer step on the global batch; pure, no host sync.

    Args:
      state: the `TrainState` (its static fields say what the step computes).
      batch: the global batch, a dict of arrays (the objective's keys: ``input_ids``,
        ``attention_mask``, ``masked_positions``, ...).
      rng: the run's dropout key; folded with ``state.step`` here.

    Returns:
      ``(state, metrics)``: the next state and device scalars (``loss``, the objective's
      metrics, ``grad_norm``, ``param_norm``, ``learning_rate``, ``nonfinite``).
    """
    rng = jax.random.fold_in(rng, state.step)
    grads, sums, norms = _gradients(state, batch, rng)
    metrics = state.spec.objective.report(sums, norms)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    if state.spec.skip_nonfinite_updates:
        # opt_state (and its schedule count) stays put, so after n skips the schedule is n
        # steps behind state.step (the reported learning_rate follows the schedule's count).
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        params = jax.tree.map(keep, params, state.params)
        opt_state = jax.tree.map(keep, opt_state, state.opt_state)
    metrics.update(
        grad_norm=grad_norm,
        param_norm=optax.tree.norm(params),
        learning_rate=state.learning_rate_fn(schedule_count(state.opt_state, state.step)),
        nonfinite=(~finite).astype(jnp.float32),
    )
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def schedule_count(opt_state, default: Array) -> Array:
    """The step count the optimizer's LR schedule is at (it lags ``state.step`` by the skipped
    updates, and restarts with a phase: bertjax/training/phases.py); ``default`` without one."""
    found = [
        node.count
        for node in jax.tree.leaves(
            opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)
        )
        if isinstance(node, optax.ScaleByScheduleState)
    ]
    return found[0] if found else default


def eval_step(state: TrainState, batch: dict) -> dict:
    """Deterministic metrics of one batch, plus its loss ``sums`` and ``norms``: adding those
    over many batches and calling ``objective.report`` gives exact held-out averages; with
    ``predictions`` when the objective scores them (fine-tuning).

    Args:
      state: the `TrainState`.
      batch: a global batch, as for `train_step`.

    Returns:
      A dict of device arrays: the objective's report (``loss``, ...), ``sums``, ``norms`` and,
      for fine-tuning, ``predictions``.
    """
    objective = state.spec.objective
    outputs = _forward(
        state.spec, state.params, batch, None, deterministic=True, frozen=state.frozen
    )
    sums, norms = objective.sums(outputs, batch), objective.norms(batch)
    result = {**objective.report(sums, norms), "sums": sums, "norms": norms}
    predictions = objective.predictions(outputs)
    if predictions is not None:
        result["predictions"] = predictions
    return result


class Steps(NamedTuple):
    """`train_step` and `eval_step` jitted once for one mesh and state layout."""

    train: Callable
    eval: Callable


def _on_mesh(fn: Callable, mesh: Mesh) -> Callable:
    def bound(*args):
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.logical_axis_rules()),
        ):
            return fn(*args)

    bound.__name__ = fn.__name__
    return bound


# config.fast_compile: XLA's -O0 and, on the CPU, the classic fusion emitters rather than the MLIR
# ones. bert_tiny's train step on this CPU compiles in 4.9 s at -O2, 2.7 s at -O0, 1.7 s with both.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def compiler_options(config) -> dict | None:
    """XLA options for the run's jits: `FAST_COMPILE` under ``config.fast_compile`` (a step
    compiles several times faster and runs slower: for smoke runs and tests, not training)."""
    return dict(FAST_COMPILE) if config.get("fast_compile") else None


def jit_steps(state: TrainState, mesh: Mesh, options: dict | None = None) -> Steps:
    """Jitted train/eval steps with state/batch shardings; the train state is donated.
    ``options``: XLA compiler options (`compiler_options`)."""
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    batch, everything = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    train = jax.jit(
        _on_mesh(train_step, mesh),
        in_shardings=(state_shardings, batch, everything),
        out_shardings=(state_shardings, everything),
        donate_argnums=(0,),
        compiler_options=options,
    )
    evaluate = jax.jit(
        _on_mesh(eval_step, mesh),
        in_shardings=(state_shardings, batch),
        out_shardings=everything,
        compiler_options=options,
    )
    return Steps(train, evaluate)
