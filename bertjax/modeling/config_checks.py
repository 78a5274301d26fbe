"""BertConfig's validation: one message per invalid field, naming it and what it must be; and
the allowed values of its string fields. Functions of the config, kept apart from the
dataclass so that `bertjax.modeling.bert_config` stays the readable list of fields."""

from __future__ import annotations

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
MODEL_TYPES = ("bert", "roberta", "albert", "electra", "modernbert")
POSITION_TYPES = ("absolute", "rope")
MLP_TYPES = ("mlp", "glu")
POOLINGS = ("pooler", "cls", "mean", "first", "electra_hf")
INIT_SCHEMES = ("bert", "modernbert", "modernbert_hf")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


def validate(cfg) -> None:
    """Raises ValueError naming the first invalid field of a BertConfig (``cfg``)."""
    positive = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
    if not isinstance(cfg.type_vocab_size, int) or cfg.type_vocab_size < 0:
        raise ValueError(
            "BertConfig.type_vocab_size must be an integer >= 0 (0: no token-type table), got"
            f" {cfg.type_vocab_size!r}"
        )
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(
            f"BertConfig.hidden_size ({cfg.hidden_size}) must be divisible by "
            f"num_attention_heads ({cfg.num_attention_heads})"
        )
    if cfg.hidden_act not in ACTIVATIONS:
        raise ValueError(f"BertConfig.hidden_act {cfg.hidden_act!r} is not one of {ACTIVATIONS}")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        value = getattr(cfg, name)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
    if cfg.classifier_dropout is not None and not 0.0 <= cfg.classifier_dropout < 1.0:
        raise ValueError(
            f"BertConfig.classifier_dropout must be in [0, 1), got {cfg.classifier_dropout!r}"
        )
    if cfg.layer_norm_eps <= 0:
        raise ValueError(f"BertConfig.layer_norm_eps must be positive, got {cfg.layer_norm_eps!r}")
    if cfg.position_embedding_init not in ("normal", "sinusoidal", "fourier"):
        raise ValueError(
            "BertConfig.position_embedding_init must be 'normal', 'sinusoidal' or "
            f"'fourier', got {cfg.position_embedding_init!r}"
        )
    if cfg.position_embedding_init == "fourier" and (
        cfg.head_dim % 2 or cfg.head_dim > cfg.embedding_dim
    ):
        raise ValueError(
            f"BertConfig.position_embedding_init='fourier' needs an even head_dim "
            f"({cfg.head_dim}) no wider than the embeddings ({cfg.embedding_dim})"
        )
    _validate_local_attention(cfg)
    if cfg.initializer_range <= 0:
        raise ValueError(
            f"BertConfig.initializer_range must be positive, got {cfg.initializer_range!r}"
        )
    if cfg.position_offset < 0:
        raise ValueError(f"BertConfig.position_offset must be >= 0, got {cfg.position_offset!r}")
    if cfg.embedding_size is not None and cfg.embedding_size <= 0:
        raise ValueError(
            f"BertConfig.embedding_size must be positive or None, got {cfg.embedding_size!r}"
        )
    if cfg.num_hidden_groups is not None:
        if cfg.num_hidden_groups <= 0 or cfg.num_hidden_layers % cfg.num_hidden_groups:
            raise ValueError(
                f"BertConfig.num_hidden_groups ({cfg.num_hidden_groups}) must be positive and "
                f"divide num_hidden_layers ({cfg.num_hidden_layers})"
            )
    if cfg.model_type not in MODEL_TYPES:
        raise ValueError(f"BertConfig.model_type {cfg.model_type!r} is not one of {MODEL_TYPES}")
    for name, allowed in (
        ("dtype", DTYPES),
        ("param_dtype", DTYPES),
        ("matmul_dtype", (None, *DTYPES)),
        ("attention_implementation", (None, *_kernel_names())),
    ):
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"BertConfig.{name} {getattr(cfg, name)!r} is not one of {allowed}")
    if not isinstance(cfg.causal, bool):
        raise ValueError(f"BertConfig.causal must be True or False, got {cfg.causal!r}")
    if cfg.remat not in REMAT_POLICIES:
        raise ValueError(f"BertConfig.remat {cfg.remat!r} is not one of {REMAT_POLICIES}")
    _validate_moe(cfg)
    _validate_modern(cfg)
    for name in (
        "pad_token_id",
        "unk_token_id",
        "cls_token_id",
        "sep_token_id",
        "mask_token_id",
    ):
        value = getattr(cfg, name)
        if value is not None and not 0 <= value < cfg.vocab_size:
            raise ValueError(
                f"BertConfig.{name} ({value}) is outside the vocabulary [0, {cfg.vocab_size})"
            )


def _kernel_names() -> tuple:
    """The attention kernels BertConfig.attention_implementation may name (imported late: the
    kernel table imports the ops, which need no config)."""
    from bertjax.modeling.attention_kernels import KERNEL_NAMES

    return KERNEL_NAMES


def _validate_local_attention(cfg) -> None:
    offsets = tuple(cfg.local_attention_offsets)  # JSON and ml_collections may give a list
    object.__setattr__(cfg, "local_attention_offsets", offsets)
    if not offsets:
        return
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ValueError(f"BertConfig.local_attention_offsets must be integers, got {offsets!r}")
    problems = []
    if len(offsets) > cfg.num_attention_heads:
        problems.append(f"{len(offsets)} offsets for {cfg.num_attention_heads} heads")
    if cfg.position_embedding_init != "fourier":
        problems.append("it needs position_embedding_init='fourier'")
    if cfg.embedding_dim != cfg.hidden_size or cfg.num_groups != cfg.num_hidden_layers:
        problems.append("it needs unfactorized embeddings and unshared layers")
    if any(abs(o) >= cfg.head_dim for o in offsets):
        problems.append(f"offsets must be shorter than head_dim ({cfg.head_dim})")
    if not cfg.local_attention_logit > 0:
        problems.append(
            f"local_attention_logit must be positive, got {cfg.local_attention_logit!r}"
        )
    if problems:
        raise ValueError(f"BertConfig.local_attention_offsets={offsets!r}: " + "; ".join(problems))


def _validate_moe(cfg) -> None:
    """Mixture-of-experts fields (see bertjax/modeling/moe.py)."""
    for name, low in (("num_experts", 0), ("experts_per_token", 1), ("moe_layer_interval", 1)):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"BertConfig.{name} must be an integer >= {low}, got {value!r}")
    if cfg.num_experts and cfg.experts_per_token > cfg.num_experts:
        raise ValueError(
            f"BertConfig.experts_per_token ({cfg.experts_per_token}) must not "
            f"exceed num_experts ({cfg.num_experts})"
        )
    if cfg.moe_routing not in ("token_choice", "expert_choice"):
        raise ValueError(
            "BertConfig.moe_routing must be 'token_choice' or 'expert_choice', got "
            f"{cfg.moe_routing!r}"
        )
    if cfg.moe_routing == "expert_choice" and cfg.expert_capacity_factor is None:
        raise ValueError(
            "BertConfig.moe_routing='expert_choice' needs an expert_capacity_factor"
            " (the tokens each expert picks), got None"
        )
    if cfg.expert_capacity_factor is not None and not cfg.expert_capacity_factor > 0:
        raise ValueError(
            "BertConfig.expert_capacity_factor must be positive or None "
            f"(dropless), got {cfg.expert_capacity_factor!r}"
        )
    for name in ("router_z_loss_weight", "load_balance_loss_weight"):
        if not getattr(cfg, name) >= 0:
            raise ValueError(f"BertConfig.{name} must be >= 0, got {getattr(cfg, name)!r}")
    if cfg.num_experts and cfg.scan_layers and cfg.moe_layer_interval != 1:
        raise ValueError(
            f"BertConfig.moe_layer_interval={cfg.moe_layer_interval} needs scan_layers=False:"
            " a scanned encoder repeats one layer type, so with scan_layers every layer is MoE"
            " (moe_layer_interval=1)"
        )
    if cfg.num_experts and cfg.moe_layer_interval > cfg.num_groups:
        raise ValueError(
            f"BertConfig.moe_layer_interval ({cfg.moe_layer_interval}) exceeds "
            f"the {cfg.num_groups} distinct layers: no layer would be MoE"
        )


def _validate_modern(cfg) -> None:
    """The ModernBERT-shape fields (see the class body)."""
    for name, allowed in (
        ("position_embedding_type", POSITION_TYPES),
        ("mlp_type", MLP_TYPES),
        ("classifier_pooling", POOLINGS),
        ("init_scheme", INIT_SCHEMES),
        ("head_act", (None, *ACTIVATIONS)),
    ):
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"BertConfig.{name} {getattr(cfg, name)!r} is not one of {allowed}")
    for name in ("embedding_dropout_prob", "mlp_dropout_prob"):
        value = getattr(cfg, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"BertConfig.{name} must be in [0, 1) or None, got {value!r}")
    for name in ("rope_theta", "local_rope_theta"):
        value = getattr(cfg, name)
        if value is not None and not value > 1.0:
            raise ValueError(f"BertConfig.{name} must be > 1, got {value!r}")
    if cfg.position_embedding_type == "rope":
        if cfg.head_dim % 2:
            raise ValueError(f"BertConfig: RoPE needs an even head_dim, got {cfg.head_dim}")
        if cfg.local_attention_offsets or cfg.position_embedding_init != "normal":
            raise ValueError(
                "BertConfig.position_embedding_type='rope' has no position table, so "
                f"BertConfig.position_embedding_init={cfg.position_embedding_init!r} and "
                f"BertConfig.local_attention_offsets={cfg.local_attention_offsets!r} do not "
                "apply: set them to 'normal' and ()"
            )
    window, every = cfg.local_attention_window, cfg.global_attn_every_n_layers
    if not isinstance(window, int) or isinstance(window, bool) or window < 0 or window == 1:
        raise ValueError(
            f"BertConfig.local_attention_window must be 0 (global) or an integer >= 2, got "
            f"{window!r}"
        )
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(
            f"BertConfig.global_attn_every_n_layers must be an integer >= 1, got {every!r}"
        )
    mixed = window > 0 and every > 1 and cfg.num_hidden_layers > 1
    irregular = mixed or (cfg.pre_layer_norm and not cfg.first_attention_norm)
    if irregular and (cfg.scan_layers or cfg.num_groups != cfg.num_hidden_layers):
        raise ValueError(
            "BertConfig: layers of different kinds (alternating local/global attention, or "
            "first_attention_norm=False) need scan_layers=False and unshared layers "
            "(num_hidden_groups=None): a scanned or shared stack repeats one layer"
        )
    if not cfg.first_attention_norm and not cfg.pre_layer_norm:
        raise ValueError("BertConfig.first_attention_norm=False needs pre_layer_norm=True")
