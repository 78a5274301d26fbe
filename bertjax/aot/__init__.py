"""Ahead-of-time compiles for accelerators this host does not have (`python -m bertjax.compile`).

chips.py   TPU slice names -> abstract devices, and the published per-chip figures (one table)
hlo.py     what a compiled program holds: memory per chip, collectives, a roofline
plan.py    every phase's train step and the eval step of a run config, compiled for a slice
"""
