"""MTEB tasks by name or from local files, and one evaluation of a bertjax embedder on them
(what ``python -m bertjax.embed --mteb=TASKS`` runs).

A task is an mteb task name (``SciFact``: mteb downloads its data from the Hub, as it does for
every model) or a local directory, which mteb reads the way it reads every retrieval task: its
own ``load_data`` calls ``datasets.load_dataset`` on the task's ``dataset["path"]``, here a
folder in the layout of mteb's retrieval sets on the Hub (a README.md whose ``configs`` name
``corpus``, ``queries`` and ``default`` (the qrels), each a split's parquet files). A BEIR
directory (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``, what ``--beir_dir``
reads) is written into that layout once, under bertjax's cache, keyed by its files' contents;
a folder already in that layout is read as it is. Nothing is downloaded for a local task.

Results go where mteb keeps them (``mteb.ResultCache``): ``OUTPUT/results/<model>/<revision>/
<task>.json``; a task already there for the same model revision is read back, not rerun.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from bertjax import paths
from bertjax.data.text.beir import read_beir

LAYOUT_README = """---
configs:
- config_name: corpus
  data_files:
  - split: {split}
    path: corpus/{split}-*
- config_name: queries
  data_files:
  - split: {split}
    path: queries/{split}-*
- config_name: default
  data_files:
  - split: {split}
    path: data/{split}-*
---
A retrieval task in the layout of mteb's sets on the Hub, written by bertjax from {source}.
"""
SHARD = "{split}-00000-of-00001.parquet"
REPORTED = ("ndcg_at_10", "mrr_at_10", "recall_at_100")  # printed beside the main score


def _digest(directory: str, split: str) -> str:
    """A hash of a BEIR directory's three files (their bytes) and the split."""
    digest = hashlib.sha256(split.encode())
    for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        path = paths.join(directory, name)
        if paths.isfile(path):
            digest.update(f"\n{name}\n".encode())
            digest.update(paths.Path(path).read_bytes())
    return digest.hexdigest()[:16]


def write_layout(beir_dir: str, split: str, folder: str) -> None:
    """Writes the BEIR directory's ``split`` into ``folder`` in mteb's retrieval layout (the
    texts as `read_beir` reads them: a document's title and text joined, judged queries)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = read_beir(beir_dir, split)
    string = pa.string()
    tables = {
        "corpus": pa.table(
            {
                "id": list(data.corpus),
                "title": [""] * len(data.corpus),
                "text": list(data.corpus.values()),
            },
            schema=pa.schema([("id", string), ("title", string), ("text", string)]),
        ),
        "queries": pa.table(
            {"id": list(data.queries), "text": list(data.queries.values())},
            schema=pa.schema([("id", string), ("text", string)]),
        ),
        "data": pa.table(
            {
                "query-id": [q for q, judged in data.qrels.items() for _ in judged],
                "corpus-id": [d for judged in data.qrels.values() for d in judged],
                "score": [s for judged in data.qrels.values() for s in judged.values()],
            },
            schema=pa.schema([("query-id", string), ("corpus-id", string), ("score", pa.int32())]),
        ),
    }
    for config, table in tables.items():
        os.makedirs(os.path.join(folder, config), exist_ok=True)
        pq.write_table(table, os.path.join(folder, config, SHARD.format(split=split)))
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write(LAYOUT_README.format(split=split, source=beir_dir))


def local_dataset(directory: str, split: str) -> tuple[str, str]:
    """(folder in mteb's layout, revision) of the local task ``directory``: the folder itself
    when it holds a README.md (the layout already), else its BEIR files written once under the
    cache (the revision: their contents' hash)."""
    if paths.isfile(paths.join(directory, "README.md")) and not paths.isfile(
        paths.join(directory, "corpus.jsonl")
    ):
        return directory, "local"
    if not paths.isfile(paths.join(directory, "corpus.jsonl")):
        raise FileNotFoundError(
            f"--mteb={directory!r}: a local task is a BEIR directory (corpus.jsonl, "
            "queries.jsonl, qrels/) or a folder in mteb's layout (README.md with configs)"
        )
    revision = _digest(directory, split)
    folder = os.path.join(paths.cache_dir(), "mteb_tasks", revision)
    if not os.path.isfile(os.path.join(folder, "README.md")):  # written last: whole when there
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        staging = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=".staging-")
        try:
            write_layout(directory, split, staging)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder, revision


def local_task(directory: str, split: str = "test"):
    """An mteb retrieval task over the local ``directory`` (module docstring), named after it."""
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    folder, revision = local_dataset(directory, split)
    name = os.path.basename(os.path.normpath(directory))

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name=name,
            description=f"A local retrieval set ({directory}).",
            dataset={"path": folder, "revision": revision},
            type="Retrieval",
            category="t2t",
            eval_splits=[split],
            eval_langs=["eng-Latn"],
            main_score="ndcg_at_10",
        )

    return LocalRetrieval()


def tasks(names: list[str], split: str = "test") -> list:
    """The tasks ``names`` name: a local directory (`local_task`) or an mteb task name; an
    unknown name stops with mteb's suggestion."""
    import mteb

    chosen = []
    for name in names:
        if paths.isdir(name):
            chosen.append(local_task(paths.resolve(name), split))
            continue
        try:
            chosen.append(mteb.get_task(name))
        except KeyError as error:
            raise ValueError(
                f"--mteb={name!r}: neither a directory nor an mteb task ({error.args[0]})"
            ) from None
    return chosen


def load_data(task) -> None:
    """Loads ``task``'s data now (before the model), a failed download as one line."""
    try:
        task.load_data()
    except ConnectionError as error:
        from huggingface_hub import constants

        where = task.metadata.dataset.get("path")
        line = (
            f"--mteb={task.metadata.name}: mteb could not load {where} from the Hub ({error}); "
            "on an offline machine give a local task: --mteb=DIR (a BEIR directory)"
        )
        if constants.HF_HUB_OFFLINE:  # a setting, not an outage: no rerun gets past it
            raise ValueError(line) from None
        raise ConnectionError(line) from error  # the Hub did not answer: rerun (status 75)


def evaluate(encoder, chosen: list, output: str) -> dict[str, dict]:
    """Runs mteb on ``chosen`` with ``encoder`` (a `MtebEncoder`), its results kept under
    ``output``; returns {task: {split: {metric: value}}}: each task's main score and the
    `REPORTED` retrieval metrics where it has them."""
    import mteb

    for task in chosen:
        load_data(task)
    result = mteb.evaluate(
        encoder,
        chosen,
        cache=mteb.ResultCache(output),
        overwrite_strategy="only-missing",
        show_progress_bar=False,
        encode_kwargs={"batch_size": encoder.batch_size or 32},
    )
    names = {task.metadata.name: task.metadata.main_score for task in chosen}
    summary = {}
    for task_result in result.task_results:
        main = names.get(task_result.task_name, "main_score")
        summary[task_result.task_name] = {
            split: {
                key: scores[0][key] for key in dict.fromkeys((main, *REPORTED)) if key in scores[0]
            }
            for split, scores in task_result.scores.items()
        }
    return summary
