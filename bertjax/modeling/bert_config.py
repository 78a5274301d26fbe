"""BertConfig: the one frozen model config shared by every Linen module.

Shape suffixes used across bertjax (``q_BTNH``, ``logits_BPV``), one letter per meaning:

====  ===========================================================================
B     batch rows
T     sequence length (queries; tokens of a routing group)
S     key/value length (attention)
N     attention heads
H     head size (BertConfig.head_dim)
D     model width (hidden_size)
F     feed-forward width (intermediate_size)
W     embedding width (embedding_dim: ALBERT's factorized E, else D)
V     vocabulary
P     predicted (masked) positions per row
R     rows gathered per example (sparse last layer)
C     expert capacity (MoE buffers)
L     labels (classification heads)
E     experts
G     MoE routing groups (one per sequence)
I, O  a product's input and output widths (bertjax/ops/dense.py)
====  ===========================================================================
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

ACTIVATIONS = (
    "gelu",
    "gelu_new",
    "gelu_tanh",
    "gelu_pytorch_tanh",
    "relu",
    "silu",
    "swish",
    "tanh",
)
MODEL_TYPES = ("bert", "roberta", "albert", "electra")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")

# name: (layers, hidden, heads); intermediate = 4 * hidden as in Turc et al. "Well-Read Students".
_PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT-family encoder; variants are fields, not subclasses."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # "gelu" is exact erf GELU; "gelu_new"/"gelu_tanh" the tanh form
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    # Position-table init: "normal" (BERT), "sinusoidal" (Vaswani et al. sin/cos rows scaled to
    # std initializer_range) or "fourier" (cos/sin pairs at the head_dim/2 frequencies
    # pi*(i+1/2)/(head_dim/2) in the first head_dim columns, zeros elsewhere, rows as long as normal
    # rows: rows of positions less than head_dim apart are orthogonal; positions 2*head_dim apart
    # share a row). All are learned; only initial values differ, so HF conversion is unchanged.
    position_embedding_init: str = "normal"
    # Relative offsets the first layer's heads attend to at init (head h -> offsets[h], e.g. (-1,
    # 1):
    # the left and right neighbour); needs position_embedding_init="fourier". The query/key kernel
    # rows of the position columns are set so that a head's logit is about local_attention_logit at
    # its offset and about 0 elsewhere. (): BERT's random init.
    local_attention_offsets: tuple = ()
    local_attention_logit: float = 6.0
    layer_norm_eps: float = 1e-12
    pre_layer_norm: bool = False  # False: BERT's post-LN; True: pre-LN with a final LayerNorm
    position_offset: int = 0  # RoBERTa: position ids start at padding_idx + 1 = 2
    embedding_size: int | None = None  # ALBERT factorized embeddings (None: hidden_size)
    num_hidden_groups: int | None = None  # ALBERT cross-layer sharing (None: no sharing)
    classifier_dropout: float | None = None  # None: hidden_dropout_prob
    model_type: str = "bert"  # which Hugging Face family convert.to_hf writes
    pad_token_id: int = 0  # special-token ids (None: unknown); defaults match bertjax tokenizers
    unk_token_id: int | None = 1
    cls_token_id: int | None = 2
    sep_token_id: int | None = 3
    mask_token_id: int | None = 4
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters (master weights)
    # Operand dtype of the dense products (Q/K/V, attention output, feed-forward, MLM transform
    # and tied decoder; None: `dtype`). "bfloat16" with dtype "float32": bf16 products that
    # accumulate in fp32 while activations stay fp32 (a TPU's default fp32 matmul precision;
    # ~2x the fp32 matmul rate on CPUs with AVX512-BF16).
    matmul_dtype: str | None = None
    scan_layers: bool = False  # nn.scan over layers: one compiled layer, stacked params
    remat: str = "none"  # rematerialisation policy per layer: none | full | dots | dots_no_batch
    # None: products.attention on the CPU (hand-written backward, row chains), else
    # jax.nn.dot_product_attention's own choice; "xla" | "cudnn": dot_product_attention with it
    attention_implementation: str | None = None
    num_experts: int = 0  # mixture-of-experts feed-forward experts per MoE layer (0: dense)
    experts_per_token: int = 1  # top-k routing: experts each token is sent to
    moe_layer_interval: int = 1  # every n-th layer (indices n-1, 2n-1, ...) is MoE; 1: all
    expert_capacity_factor: float | None = 1.25  # C = ceil(f * tokens * k / E); None: dropless
    # "token_choice": each token picks its top-k experts (Switch/GShard; overflow dropped);
    # "expert_choice": each expert picks its top-C tokens of the sequence (Zhou et al. 2022):
    # balanced by construction, a token gets 0..E experts, k*f experts per token on average.
    moe_routing: str = "token_choice"
    router_z_loss_weight: float = 1e-3  # ST-MoE router z-loss weight in the total loss
    load_balance_loss_weight: float = 1e-2  # Switch load-balancing loss weight in the total loss

    def __post_init__(self):
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"BertConfig.hidden_act {self.hidden_act!r} is not one of {ACTIVATIONS}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(
                f"BertConfig.classifier_dropout must be in [0, 1), got {self.classifier_dropout!r}"
            )
        if self.layer_norm_eps <= 0:
            raise ValueError(
                f"BertConfig.layer_norm_eps must be positive, got {self.layer_norm_eps!r}"
            )
        if self.position_embedding_init not in ("normal", "sinusoidal", "fourier"):
            raise ValueError(
                "BertConfig.position_embedding_init must be 'normal', 'sinusoidal' or "
                f"'fourier', got {self.position_embedding_init!r}"
            )
        if self.position_embedding_init == "fourier" and (
            self.head_dim % 2 or self.head_dim > self.embedding_dim
        ):
            raise ValueError(
                f"BertConfig.position_embedding_init='fourier' needs an even head_dim "
                f"({self.head_dim}) no wider than the embeddings ({self.embedding_dim})"
            )
        self._validate_local_attention()
        if self.initializer_range <= 0:
            raise ValueError(
                f"BertConfig.initializer_range must be positive, got {self.initializer_range!r}"
            )
        if self.position_offset < 0:
            raise ValueError(
                f"BertConfig.position_offset must be >= 0, got {self.position_offset!r}"
            )
        if self.embedding_size is not None and self.embedding_size <= 0:
            raise ValueError(
                f"BertConfig.embedding_size must be positive or None, got {self.embedding_size!r}"
            )
        if self.num_hidden_groups is not None:
            if self.num_hidden_groups <= 0 or self.num_hidden_layers % self.num_hidden_groups:
                raise ValueError(
                    f"BertConfig.num_hidden_groups ({self.num_hidden_groups}) must be positive and "
                    f"divide num_hidden_layers ({self.num_hidden_layers})"
                )
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"BertConfig.model_type {self.model_type!r} is not one of {MODEL_TYPES}"
            )
        for name, allowed in (
            ("dtype", DTYPES),
            ("param_dtype", DTYPES),
            ("matmul_dtype", (None, *DTYPES)),
            ("attention_implementation", (None, "xla", "cudnn")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"BertConfig.{name} {getattr(self, name)!r} is not one of {allowed}"
                )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"BertConfig.remat {self.remat!r} is not one of {REMAT_POLICIES}")
        self._validate_moe()
        for name in (
            "pad_token_id",
            "unk_token_id",
            "cls_token_id",
            "sep_token_id",
            "mask_token_id",
        ):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"BertConfig.{name} ({value}) is outside the vocabulary [0, {self.vocab_size})"
                )

    def _validate_local_attention(self):
        offsets = tuple(self.local_attention_offsets)  # JSON and ml_collections may give a list
        object.__setattr__(self, "local_attention_offsets", offsets)
        if not offsets:
            return
        if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
            raise ValueError(
                f"BertConfig.local_attention_offsets must be integers, got {offsets!r}"
            )
        problems = []
        if len(offsets) > self.num_attention_heads:
            problems.append(f"{len(offsets)} offsets for {self.num_attention_heads} heads")
        if self.position_embedding_init != "fourier":
            problems.append("it needs position_embedding_init='fourier'")
        if self.embedding_dim != self.hidden_size or self.num_groups != self.num_hidden_layers:
            problems.append("it needs unfactorized embeddings and unshared layers")
        if any(abs(o) >= self.head_dim for o in offsets):
            problems.append(f"offsets must be shorter than head_dim ({self.head_dim})")
        if not self.local_attention_logit > 0:
            problems.append(
                f"local_attention_logit must be positive, got {self.local_attention_logit!r}"
            )
        if problems:
            raise ValueError(
                f"BertConfig.local_attention_offsets={offsets!r}: " + "; ".join(problems)
            )

    def _validate_moe(self):
        """Mixture-of-experts fields (see bertjax/modeling/moe.py)."""
        for name, low in (("num_experts", 0), ("experts_per_token", 1), ("moe_layer_interval", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"BertConfig.{name} must be an integer >= {low}, got {value!r}")
        if self.num_experts and self.experts_per_token > self.num_experts:
            raise ValueError(
                f"BertConfig.experts_per_token ({self.experts_per_token}) must not "
                f"exceed num_experts ({self.num_experts})"
            )
        if self.moe_routing not in ("token_choice", "expert_choice"):
            raise ValueError(
                "BertConfig.moe_routing must be 'token_choice' or 'expert_choice', got "
                f"{self.moe_routing!r}"
            )
        if self.moe_routing == "expert_choice" and self.expert_capacity_factor is None:
            raise ValueError(
                "BertConfig.moe_routing='expert_choice' needs an expert_capacity_factor"
                " (the tokens each expert picks), got None"
            )
        if self.expert_capacity_factor is not None and not self.expert_capacity_factor > 0:
            raise ValueError(
                "BertConfig.expert_capacity_factor must be positive or None "
                f"(dropless), got {self.expert_capacity_factor!r}"
            )
        for name in ("router_z_loss_weight", "load_balance_loss_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"BertConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.num_experts and self.scan_layers and self.moe_layer_interval != 1:
            raise ValueError(
                f"BertConfig.moe_layer_interval={self.moe_layer_interval} needs scan_layers=False:"
                " a scanned encoder repeats one layer type, so with scan_layers every layer is MoE"
                " (moe_layer_interval=1)"
            )
        if self.num_experts and self.moe_layer_interval > self.num_groups:
            raise ValueError(
                f"BertConfig.moe_layer_interval ({self.moe_layer_interval}) exceeds "
                f"the {self.num_groups} distinct layers: no layer would be MoE"
            )

    def is_moe_layer(self, group: int) -> bool:
        """Whether distinct layer ``group`` (layer index; ALBERT group) has an MoE feed-forward."""
        return self.num_experts > 0 and (group + 1) % self.moe_layer_interval == 0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size (tiny, mini, small, medium, base, large) with optional field overrides."""
        if name not in _PRESETS:
            raise ValueError(
                f"unknown BertConfig preset {name!r}; choose one of {sorted(_PRESETS)}"
            )
        layers, hidden, heads = _PRESETS[name]
        fields = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        fields.update(overrides)
        return cls.from_dict(fields)

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        """Builds a config from a dict, rejecting keys that are not fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown BertConfig field(s) {unknown}; known fields: {sorted(known)}"
            )
        return cls(**values)

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (validated again)."""
        return self.from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # Derived sizes ---------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the token embedding table (ALBERT's E; BERT's hidden size)."""
        return self.embedding_size or self.hidden_size

    @property
    def num_groups(self) -> int:
        """Number of distinct layer parameter sets (ALBERT sharing groups)."""
        return self.num_hidden_groups or self.num_hidden_layers

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self):
        return jnp.dtype(self.param_dtype)
