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

from bertjax.modeling.config_checks import (  # noqa: F401  (re-exported)
    ACTIVATIONS,
    DTYPES,
    INIT_SCHEMES,
    MLP_TYPES,
    MODEL_TYPES,
    POOLINGS,
    POSITION_TYPES,
    REMAT_POLICIES,
    validate,
)

# name: (layers, hidden, heads); intermediate = 4 * hidden as in Turc et al. "Well-Read Students".
_PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# ModernBERT (answerdotai/ModernBERT-base, -large) and the Ettin encoders (jhu-clsp/ettin-encoder-*,
# the same architecture): name: (layers, hidden, heads, intermediate = one GLU half).
_MODERN_PRESETS = {
    "modernbert-tiny": (4, 128, 2, 192),  # this CPU's size (configs/modernbert_tiny.py)
    "ettin-17m": (7, 256, 4, 384),
    "ettin-32m": (10, 384, 6, 576),
    "ettin-68m": (19, 512, 8, 768),
    "ettin-150m": (22, 768, 12, 1152),
    "ettin-400m": (28, 1024, 16, 2624),
    "ettin-1b": (28, 1792, 28, 3840),
    "modernbert-base": (22, 768, 12, 1152),
    "modernbert-large": (28, 1024, 16, 2624),
}
# The ModernBERT shape: every field that differs from BERT's defaults (HF ModernBertConfig and
# the paper's training yamls: attention-output dropout 0.1, none elsewhere; RoPE 160k global /
# 10k local as released; 1024-token training used 10k for both).
MODERN_FIELDS = dict(
    model_type="modernbert",
    vocab_size=50368,
    max_position_embeddings=8192,
    type_vocab_size=0,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.0,
    embedding_dropout_prob=0.0,
    mlp_dropout_prob=0.0,
    layer_norm_eps=1e-5,
    pre_layer_norm=True,
    first_attention_norm=False,
    position_embedding_type="rope",
    rope_theta=160000.0,
    local_rope_theta=10000.0,
    local_attention_window=128,
    global_attn_every_n_layers=3,
    mlp_type="glu",
    attention_bias=False,
    mlp_bias=False,
    norm_bias=False,
    head_bias=False,
    decoder_bias=True,
    classifier_pooling="cls",
    init_scheme="modernbert",
    pad_token_id=50283,
    unk_token_id=50280,
    cls_token_id=50281,
    sep_token_id=50282,
    mask_token_id=50284,
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT-family encoder; variants are fields, not subclasses."""

    vocab_size: int = 30522  # V: rows of the word-embedding table (set by the tokenizer)
    hidden_size: int = 768  # D: the model width
    num_hidden_layers: int = 12  # encoder layers
    num_attention_heads: int = 12  # N: heads per attention layer (head size D / N)
    intermediate_size: int = 3072  # F: feed-forward width (a GLU's: each of its two halves)
    hidden_act: str = "gelu"  # "gelu" is exact erf GELU; "gelu_new"/"gelu_tanh" the tanh form
    hidden_dropout_prob: float = 0.1  # dropout on embeddings and every sublayer's output
    attention_probs_dropout_prob: float = 0.1  # dropout on the attention probabilities
    max_position_embeddings: int = 512  # longest row (rows of the position table)
    type_vocab_size: int = 2  # token types (segments A, B); 0: no token-type table
    initializer_range: float = 0.02  # std of the weight init (init_scheme: its distribution)
    # Position-table init: "normal" (BERT), "sinusoidal" (Vaswani et al. sin/cos rows scaled to
    # std initializer_range) or "fourier" (cos/sin pairs at the head_dim/2 frequencies
    # pi*(i+1/2)/(head_dim/2) in the first head_dim columns, zeros elsewhere, rows as long as normal
    # rows: rows of positions less than head_dim apart are orthogonal; positions 2*head_dim apart
    # share a row). All are learned; only initial values differ, so HF conversion is unchanged.
    position_embedding_init: str = "normal"
    # Relative offsets the first layer's heads attend to at init (head h -> offsets[h], e.g.
    # (-1, 1): the left and right neighbour); needs position_embedding_init="fourier". The
    # query/key kernel rows of the position columns are set so that a head's logit is about
    # local_attention_logit at its offset and about 0 elsewhere. (): BERT's random init.
    local_attention_offsets: tuple = ()
    local_attention_logit: float = 6.0  # local_attention_offsets: a head's logit there at init
    layer_norm_eps: float = 1e-12  # added to the variance in every LayerNorm
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
    # None: the first attention kernel that serves each layer's attention on this platform
    # (bertjax/modeling/attention_kernels.py); a kernel's name forces it ("cpu_dense", "xla",
    # "cudnn", "splash", "exact", ...; it raises if it cannot serve a layer)
    attention_implementation: str | None = None
    # True: no token attends to a later one (within its segment), in every layer and kernel; the
    # mask a causal-LM objective trains under
    causal: bool = False
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
    # The ModernBERT shape (Warner et al. 2024; transformers' `modernbert` is the reference); each
    # field at its default is BERT's choice, and ModernBERT/Ettin set them all (BertConfig.modern).
    position_embedding_type: str = "absolute"  # "absolute": learned table; "rope": rotary q/k
    rope_theta: float = 10000.0  # RoPE base of global layers (ModernBERT: 160k after phase 1)
    local_rope_theta: float | None = None  # RoPE base of local layers (None: rope_theta)
    # Total width of local attention (HF's `local_attention`): a local layer's query at t sees
    # keys s with |s - t| <= window // 2; 0: every layer attends globally.
    local_attention_window: int = 0
    # with a window: layers 0, n, 2n, ... attend globally, the others locally (1: all global)
    global_attn_every_n_layers: int = 1
    mlp_type: str = "mlp"  # "mlp": D->F, act, F->D; "glu": D->2F, act(input) * gate, F->D (GeGLU)
    attention_bias: bool = True  # Q/K/V and attention-output biases
    mlp_bias: bool = True  # feed-forward biases
    norm_bias: bool = True  # LayerNorm biases (scale only when False)
    head_bias: bool = True  # bias of the heads' dense transform (HF ModernBERT: classifier_bias)
    decoder_bias: bool = True  # MLM decoder bias
    head_act: str | None = None  # activation of the heads' transform (None: hidden_act)
    first_attention_norm: bool = True  # pre-LN only; False: layer 0's attention norm is identity
    # Sequence classification: "pooler" (BERT: tanh dense on [CLS]) | "cls" | "mean" (ModernBERT:
    # the [CLS] row or the mean of real tokens, then the head's dense, activation, norm) |
    # "first" (ELECTRA's code: the first token's output straight into the classifier) |
    # "electra_hf" (HF's ElectraClassificationHead: first token, dense, GELU, then classifier).
    classifier_pooling: str = "pooler"
    embedding_dropout_prob: float | None = None  # after the embedding norm (None: hidden_dropout)
    # Feed-forward dropout (None: hidden_dropout_prob): on its output ("mlp"), or on the gated
    # F-wide activation before the output product ("glu", as ModernBERT).
    mlp_dropout_prob: float | None = None
    # "bert": normal(initializer_range); "modernbert" (ModernBERT's training code, full_megatron):
    # truncated at +-2 std, the attention and feed-forward output products and the classifier
    # head's transform at std / sqrt(2 L), the MLM head's transform at std (an "in" module);
    # "modernbert_hf": the same but the MLM head's transform at std / sqrt(2 L) (HF's
    # _init_weights, what transformers users get).
    init_scheme: str = "bert"

    def __post_init__(self):
        validate(self)  # bertjax/modeling/config_checks.py: one message per invalid field

    def attention_window(self, layer: int) -> int:
        """Half-width of layer ``layer``'s local attention (keys within it of the query), or 0
        for a global layer: layers 0, n, 2n, ... are global (n = global_attn_every_n_layers)."""
        if not self.local_attention_window or layer % self.global_attn_every_n_layers == 0:
            return 0
        return self.local_attention_window // 2

    def layer_rope_theta(self, layer: int) -> float:
        """The RoPE base of layer ``layer``: local layers' own when set."""
        if self.attention_window(layer) and self.local_rope_theta is not None:
            return self.local_rope_theta
        return self.rope_theta

    @property
    def head_activation(self) -> str:
        return self.head_act or self.hidden_act

    @property
    def embedding_dropout(self) -> float:
        if self.embedding_dropout_prob is None:
            return self.hidden_dropout_prob
        return self.embedding_dropout_prob

    @property
    def mlp_dropout(self) -> float:
        return self.hidden_dropout_prob if self.mlp_dropout_prob is None else self.mlp_dropout_prob

    def is_moe_layer(self, group: int) -> bool:
        """Whether distinct layer ``group`` (layer index; ALBERT group) has an MoE feed-forward."""
        return self.num_experts > 0 and (group + 1) % self.moe_layer_interval == 0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size with optional field overrides: BERT's (tiny, mini, small, medium, base,
        large; Turc et al.) or the ModernBERT shape's (modernbert-tiny/-base/-large, ettin-17m
        ... ettin-1b: `MODERN_FIELDS` and the size)."""
        if name in _MODERN_PRESETS:
            layers, hidden, heads, intermediate = _MODERN_PRESETS[name]
            fields = dict(
                MODERN_FIELDS,
                num_hidden_layers=layers,
                hidden_size=hidden,
                num_attention_heads=heads,
                intermediate_size=intermediate,
            )
            fields.update(overrides)
            return cls.from_dict(fields)
        if name not in _PRESETS:
            raise ValueError(
                f"unknown BertConfig preset {name!r}; choose one of "
                f"{sorted(_PRESETS) + sorted(_MODERN_PRESETS)}"
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
