"""Evaluations above the trainer: suites that run many fine-tuning runs and report them.

glue          the GLUE harness (`python -m bertjax.glue`): runs per task, LR and seed; resumable
glue_report   best LR by the median over seeds, glue_results.json and the markdown table
"""
