"""Layer factories shared by every module of the encoder: initializers with logical axis names,
Dense and LayerNorm as BertConfig asks for them, the activation, dropout, and row gathers.

Every parameter carries logical axis names and main activations carry ``act_*`` names
(`bertjax.training.sharding` maps both to mesh axes); no layer names a mesh axis.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.modeling.attention_mask import gather_rows  # noqa: F401  (re-exported)
from bertjax.modeling.bert_config import BertConfig
from bertjax.ops import dense as dense_ops
from bertjax.ops.elementwise import erf_gelu, keep_mask

Array = jax.Array


def activation(name: str):
    """The feed-forward non-linearity named by BertConfig.hidden_act."""
    if name == "gelu":
        return erf_gelu
    if name in ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh"):
        return functools.partial(jax.nn.gelu, approximate=True)
    return {"relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu, "tanh": jnp.tanh}[name]


def _std_init(cfg: BertConfig, std: float):
    """normal(std) (BERT), or truncated at +-2 std (init_scheme "modernbert"/"modernbert_hf")."""
    if cfg.init_scheme != "bert":
        return nn.initializers.truncated_normal(std, lower=-2.0, upper=2.0)
    return nn.initializers.normal(std)


def normal_init(cfg: BertConfig, axes: tuple):
    """BERT's normal(initializer_range) init (see `_std_init`), boxed with logical axis names."""
    return nn.with_logical_partitioning(_std_init(cfg, cfg.initializer_range), axes)


def output_init(cfg: BertConfig, axes: tuple):
    """The init of the products that write into the residual stream (attention and feed-forward
    outputs) and of the classifier head's transform: `normal_init`, or with init_scheme
    "modernbert"/"modernbert_hf" initializer_range / sqrt(2 L) (ModernBERT's "out" std)."""
    std = cfg.initializer_range
    if cfg.init_scheme != "bert":
        std = std / (2.0 * cfg.num_hidden_layers) ** 0.5
    return nn.with_logical_partitioning(_std_init(cfg, std), axes)


def zeros_init(axes: tuple):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones_init(axes: tuple):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def dense(
    cfg: BertConfig,
    features: int,
    axes: tuple,
    name: str,
    use_bias: bool = True,
    output: bool = False,
) -> nn.Dense:
    """A Dense layer with logical names on kernel (in, out) and bias (out,); its product is
    `bertjax.ops.dense.project` (hand-written backward, optional bf16 operands). ``output``:
    the kernel takes `output_init`."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        kernel_init=(output_init if output else normal_init)(cfg, axes),
        bias_init=zeros_init(axes[-1:]),
        name=name,
        dot_general=functools.partial(dense_ops.dense_dot_general, operand_dtype=cfg.matmul_dtype),
    )


def layer_norm(cfg: BertConfig, axis: str, name: str) -> nn.LayerNorm:
    """LayerNorm with BertConfig's epsilon; without a bias when ``cfg.norm_bias`` is False."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        use_bias=cfg.norm_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        scale_init=ones_init((axis,)),
        bias_init=zeros_init((axis,)),
        name=name,
    )


def constrain(x: Array, axes: tuple) -> Array:
    """A logical sharding constraint on an activation (``act_*`` names)."""
    return nn.with_logical_constraint(x, axes)


class Dropout(nn.Module):
    """Inverted dropout (as nn.Dropout) on `keep_mask`'s bits; rng collection "dropout"."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        keep = keep_mask(self.make_rng("dropout"), x.shape, 1.0 - self.rate)
        return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros((), x.dtype))
