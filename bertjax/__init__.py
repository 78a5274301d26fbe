"""bertjax: BERT-family encoders (BERT, RoBERTa, ALBERT) in JAX/Flax."""

from bertjax.config import BertConfig
from bertjax.heads import (
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertjax.model import BertModel

__all__ = [
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
]
__version__ = "0.1.0"
