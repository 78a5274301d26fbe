"""The encoder, configured: one BertConfig, one stack, variants as fields.

bert_config    BertConfig (presets, validation) and the legend of shape suffixes
layers         initializers, Dense/LayerNorm factories, activation, dropout, row gathers
embeddings     word + position + token-type embeddings, position ids of packed rows
attention      self-attention and its paths (CPU fast path, banded local and blocked global,
               fused, TPU splash, exact); masks as segment ids and positions
rotary         rotary position embeddings (the ModernBERT shape)
config_checks  BertConfig's validation, one message per invalid field
encoder        feed-forward, transformer layer, layer stack (loop / scan / shared), BertModel
moe            mixture-of-experts feed-forward: routing, capacity, router statistics
heads          MLM (+ NSP/SOP) pretraining model, PERT's position head, sequence and token
               classifiers
electra        ELECTRA: discriminator, generator, and both in one pretraining module
position_init  sinusoidal / fourier position tables, local-attention heads at init
"""

from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.electra import ElectraDiscriminator, ElectraGenerator
from bertjax.modeling.encoder import BertModel
from bertjax.modeling.heads import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
)

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "ElectraDiscriminator",
    "ElectraGenerator",
]
