"""Evaluations above the trainer: suites that run many fine-tuning runs and report them, and the
benchmarks a trained model is scored on.

glue          the GLUE harness (`python -m bertjax.glue`): runs per task, LR and seed; resumable
glue_report   best LR by the median over seeds, glue_results.json and the markdown table
retrieval     NDCG@10, MRR@10, Recall@100 as trec_eval defines them; exact dense search
mteb_model    a bertjax embedder behind mteb's encode protocol, its prompts and ModelMeta
mteb_tasks    mteb tasks by name or from a local BEIR directory; one `mteb.evaluate` run
"""
