"""bertjax.data: corpus → tokenizer → token store → sample plans → masking → `batch(step)`."""

from bertjax.data.config import default_data_config
from bertjax.data.pipeline import Pipeline, make_pipeline
from bertjax.data.tokenizer import Tokenizer

__all__ = ["Pipeline", "Tokenizer", "default_data_config", "make_pipeline"]
