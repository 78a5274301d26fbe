"""A train step's bytes a device estimated by tracing alone (no compile): what the fit's search
reads to skip candidates far too large for the device before compiling them.

A program that needs many times a device's memory is the slowest there is to compile, and its
answer is only "no": libtpu spent over 15 minutes on the 4-layer program of modernbert_base at
576 rows a chip (~1 TiB) for v5e-8 before refusing it. The estimate adds up what a device holds:

- the train state (parameters, optimizer state): exact, from the abstract state's shapes and
  shardings (`bertjax.training.step.abstract_train_state`);
- the gradients, once, or twice with microbatches (the accumulator and one microbatch's);
- the batch's rows of the device;
- what the forward keeps for the backward: the residuals of `jax.vjp` of the step's loss
  (`bertjax.training.step.loss_function`), traced for the target's devices (so with the
  attention kernels they get) and the candidate's remat policy, its inputs left out. Those shaped
  like a parameter (weights cast to the compute dtype) are a device's whole; the rest grow with
  the rows and are split over the batch shards and the microbatches. Under remat, twice the
  residuals of a one-layer model without remat are added: the layer whose forward the backward
  is running again holds them and their cotangents (the first layer: ModernBERT's is a
  global-attention one).

XLA keeps less than the residuals (it fuses elementwise chains and recomputes them): on the
programs of docs/results/compile.md the estimate was 1.4-2.1 times the compiled bytes without
remat, 0.97-1.2 times with it. So it decides nothing: `bertjax.aot.search.search` leaves
uncompiled only candidates estimated above `bertjax.aot.search.FAR` (4) times the budget (so
needing, by those ratios, about twice the budget or more) and places its first probes with it;
the compiler's memory analysis decides among the rest.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.aot import shapes as shapes_lib


def _device_bytes(leaf) -> int:
    """Bytes of one device's shard of an abstract array (its sharding's shard shape)."""
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    return math.prod(shape) * leaf.dtype.itemsize


def _bytes(leaf) -> int:
    return math.prod(leaf.shape) * leaf.dtype.itemsize


class Estimator:
    """``estimator(candidate_config) -> bytes a device`` for the phase ``config`` on ``devices``
    (see the module docstring); the traces are kept per remat policy and mesh shape, so the
    microbatch counts of a search cost arithmetic only."""

    def __init__(self, config, model_cfg, devices: list):
        self.config, self.model_cfg, self.devices = config, model_cfg, list(devices)
        self._states: dict = {}
        self._residuals: dict = {}

    def __call__(self, candidate) -> int:
        from bertjax.training import sharding

        mesh = sharding.make_mesh(candidate.mesh, self.devices)
        shards = math.prod(dict(mesh.shape).get(a, 1) for a in sharding.BATCH_AXES)
        k = int(candidate.optim.grad_accum_steps)
        remat = str(candidate.model.get("remat", "none"))
        state, params, batch = self._state(candidate, mesh)
        fixed, rows = self._traced(candidate, mesh, remat)
        if remat != "none":  # the layer the backward runs again: its residuals and cotangents
            rows += 2 * self._traced(candidate, mesh, "one layer")[1]
        gradients = params * (2 if k > 1 else 1)
        return int(state + gradients + batch / shards + fixed + rows / shards / k)

    def _model_cfg(self, candidate, remat: str | None = None):
        remat = remat or str(candidate.model.get("remat", "none"))
        if remat == "one layer":  # the first layer (ModernBERT's is a global one), no remat
            return self.model_cfg.replace(remat="none", num_hidden_layers=1)
        return self.model_cfg.replace(remat=remat)

    def _state(self, candidate, mesh) -> tuple[int, int, int]:
        """(train state, parameters) bytes a device and the whole batch's bytes."""
        key = tuple(sorted(dict(mesh.shape).items()))
        if key not in self._states:
            from bertjax import objectives
            from bertjax.training import step as step_lib

            state, _, _ = step_lib.abstract_train_state(candidate, self._model_cfg(candidate), mesh)
            objective = objectives.make_objective(candidate)
            batch = shapes_lib.abstract_batch(
                candidate, objective, self.model_cfg, int(candidate.batch_size), False
            )
            self._states[key] = (
                sum(_device_bytes(x) for x in jax.tree.leaves(state)),
                sum(_device_bytes(x) for x in jax.tree.leaves(state.params)),
                sum(_bytes(x) for x in jax.tree.leaves(batch)),
            )
        return self._states[key]

    def _traced(self, candidate, mesh, remat: str) -> tuple[int, int]:
        """(bytes a device shaped like a parameter, bytes of the whole batch's other residuals)
        of the loss's `jax.vjp` at the whole batch (one microbatch is a share of it)."""
        if remat not in self._residuals:
            model_cfg = self._model_cfg(candidate, remat)
            self._residuals[remat] = residual_bytes(candidate, model_cfg, mesh)
        return self._residuals[remat]


def residual_bytes(config, model_cfg, mesh) -> tuple[int, int]:
    """What the forward of ``config``'s loss keeps for its backward, traced for ``mesh`` at the
    whole batch (one program, no microbatches): (bytes of the residuals shaped like a parameter,
    bytes of the others), the loss's own inputs (parameters, batch) left out."""
    from bertjax.training import sharding
    from bertjax.training import step as step_lib

    state, _, _ = step_lib.abstract_train_state(config, model_cfg, mesh)
    objective = state.spec.objective
    batch = shapes_lib.abstract_batch(config, objective, model_cfg, int(config.batch_size), False)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)

    def backward(params, frozen, batch, rng):
        with (
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.logical_axis_rules()),
        ):
            loss_fn = step_lib.loss_function(state.replace(frozen=frozen), objective.norms(batch))
            return jax.vjp(lambda p: loss_fn(p, batch, rng)[0], params)[1]

    closed = jax.make_jaxpr(backward)(state.params, state.frozen, batch, rng)
    inputs = {id(var) for var in closed.jaxpr.invars}
    dtypes = {model_cfg.compute_dtype, jnp.dtype(model_cfg.matmul_dtype or model_cfg.dtype)}
    params = jax.tree.leaves(state.params)
    shapes = {(tuple(p.shape), dtype) for p in params for dtype in {p.dtype, *dtypes}}
    fixed = rows = 0
    for var in closed.jaxpr.outvars:
        aval = var.aval
        if id(var) in inputs or not hasattr(aval, "shape"):  # an input, a key or a token
            continue
        size = math.prod(aval.shape) * aval.dtype.itemsize
        if (tuple(aval.shape), aval.dtype) in shapes:
            fixed += size
        else:
            rows += size
    return fixed, rows
