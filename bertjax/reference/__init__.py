"""The references the documentation site shows, generated from the code rather than kept by hand.

comments      a statement's description: its trailing comment, else the comment block above it
config_keys   every run-config key (`config.X`): default and meaning, from the functions and
              dataclasses that declare the keys (their comments are the descriptions)
batch_keys    the batch keys, shapes and dtypes each objective reads

docs/hooks.py renders them into the site (`mkdocs build`); tests/reference_test.py fails when a
key has no description.
"""
