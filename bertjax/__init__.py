"""bertjax: BERT-family encoders in JAX/Flax."""
