"""Fine-tuning tasks: their examples, rows, data sources and metrics, shared by training
(the fine-tuning and embedding objectives) and prediction (`python -m bertjax.predict`).

tasks              task examples (built-in, TSV/CSV/JSONL/Parquet files, tfds GLUE) encoded as rows
task_data          `TaskData`: a fine-tuning task's train/dev rows as a DataSource, dev scoring
builtin_tasks      the offline tasks made from CPython's docstrings (families, spans, order)
glue_tasks         GLUE directories as the download script writes them; official metrics, score
task_metrics       GLUE and CoNLL metrics
embedding_data     the query/document pairs of embedding training as a DataSource
encoded_rows       what those two share: rows encoded once, the init_from tokenizer or the
                   run's own, batches keyed by the step, padded held-out batches

The layers stay a DAG: bertjax/data never imports these; these never import the objectives
or training.
"""
