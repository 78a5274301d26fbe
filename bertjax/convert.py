"""Hugging Face weights both ways: the public face of `bertjax.interop.hf`.

cfg, params = bertjax.convert.from_hf("path/to/bert-base-uncased")
bertjax.convert.to_hf(cfg, params, "exported/")
"""

from bertjax.interop.hf import from_hf, stack_layers, to_hf, unstack_layers

__all__ = ["from_hf", "stack_layers", "to_hf", "unstack_layers"]
