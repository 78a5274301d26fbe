"""One loader of a trained model for inference: `python -m bertjax.predict`, `python -m
bertjax.embed` and the sentence-transformers export all read a model through `load`, so each
gets the same weights, the same tokenizer and the same run settings.

A model directory has one of three forms (`form_of`):

- a bertjax workdir (its ``best/`` when it has one, else its latest checkpoint), a ``best/`` or
  a checkpoints directory: config, params and tokenizer from the checkpoint, and from its run
  config the objective trained, the row length, the task's text columns, the pooling, and the
  tokenizer's case handling (``config.data.lowercase``, ``config.data.language``);
- a sentence-transformers directory (``modules.json``): its transformer, Pooling, Normalize;
- a Hugging Face model directory (``config.json``): its architecture gives the task.

A ``vocab.txt`` tokenizer of a Hugging Face or sentence-transformers directory lowercases (and
strips accents) as its ``tokenizer_config.json``'s ``do_lower_case`` says (True when absent, as
transformers' BertTokenizer), so a cased vocabulary keeps its case and ids equal training's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

from bertjax import paths
from bertjax.data.tokenizer import Tokenizer
from bertjax.interop import hf_files
from bertjax.interop import sentence_transformers as st_files
from bertjax.interop.checkpoints import CheckpointReader, checkpoints_dir, require_dir
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.embedder import check_pooling

TASKS = ("classify", "tag", "embed", "fill_mask")
_OBJECTIVE_TASKS = {  # config.loss.objective -> what the model predicts (default fill_mask)
    "classification": "classify",
    "token_classification": "tag",
    "embedding": "embed",
}
_ARCHITECTURE_TASKS = (  # an HF config.json's architecture suffix -> task (default embed)
    ("ForSequenceClassification", "classify"),
    ("ForTokenClassification", "tag"),
    ("ForMaskedLM", "fill_mask"),
    ("ForPreTraining", "fill_mask"),
)


@dataclasses.dataclass
class TrainedModel:
    """A model as inference needs it: weights, tokenizer and what its training settled."""

    path: str  # the directory read (a workdir's best/ when it has one)
    form: str  # "workdir", "hf" or "sentence-transformers"
    cfg: BertConfig
    params: dict  # the whole tree (a workdir's layers unstacked when it scanned them)
    tokenizer: Tokenizer
    task: str  # what it was trained to predict: one of TASKS
    max_seq_length: int
    run: dict = dataclasses.field(default_factory=dict)  # a workdir's run config
    hf_config: dict = dataclasses.field(default_factory=dict)  # an HF directory's config.json
    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = True
    columns: dict = dataclasses.field(default_factory=dict)  # the run's text columns
    step: int = 0  # a workdir's checkpoint step (0: another form)

    @property
    def limit(self) -> int:
        """The longest row the model's positions allow."""
        return self.cfg.max_position_embeddings - self.cfg.position_offset


def form_of(path: str, key: str = "--model") -> str:
    """Which form the directory ``path`` has (module docstring); a path that is no directory
    stops with one line naming ``key``."""
    require_dir(path, key)
    if st_files.is_sentence_transformers_dir(path):
        return "sentence-transformers"
    return "hf" if hf_files.is_hf_dir(path) else "workdir"


def workdir_checkpoint(path: str) -> str:
    """A workdir's ``best/`` (the best dev checkpoint) when it has one, else ``path``."""
    best = paths.join(path, "best")
    return best if paths.isdir(best) else path


def load(path: str, key: str = "--model") -> TrainedModel:
    """The model under ``path`` with its tokenizer and run settings (module docstring)."""
    form = form_of(path, key)
    if form == "workdir":
        return _load_workdir(workdir_checkpoint(path), key)
    if form == "sentence-transformers":
        cfg, params, modules = st_files.load(path)
        tokenizer = _hf_tokenizer(modules.transformer_path, key)
        length = modules.max_seq_length or _hf_length(modules.transformer_path, cfg)
        return TrainedModel(
            path, form, cfg, params, tokenizer, "embed", length,
            pooling=modules.pooling, normalize=modules.normalize,
        )  # fmt: skip
    from bertjax import convert

    cfg, params = convert.from_hf(path)
    hf_config = json.loads(paths.read_text(paths.join(path, "config.json")))
    architecture = (hf_config.get("architectures") or [""])[0]
    task = next((t for end, t in _ARCHITECTURE_TASKS if architecture.endswith(end)), "embed")
    tokenizer = _hf_tokenizer(path, key)
    return TrainedModel(
        path, form, cfg, params, tokenizer, task, _hf_length(path, cfg), hf_config=hf_config
    )


def _tokenizer_config(directory: str) -> dict:
    config_file = paths.join(directory, "tokenizer_config.json")
    return json.loads(paths.read_text(config_file)) if paths.isfile(config_file) else {}


def _hf_tokenizer(directory: str, key: str) -> Tokenizer:
    """The directory's tokenizer file, lowercasing as its tokenizer_config.json says."""
    lowercase = bool(_tokenizer_config(directory).get("do_lower_case", True))
    return Tokenizer(hf_files.tokenizer_file(directory, key), lowercase=lowercase)


def _hf_length(directory: str, cfg: BertConfig) -> int:
    """The tokenizer's model_max_length when it names one, else the positions' limit (at most
    512, as transformers' pipelines cut)."""
    limit = cfg.max_position_embeddings - cfg.position_offset
    saved = _tokenizer_config(directory).get("model_max_length")
    if isinstance(saved, (int, float)) and 0 < saved < 1_000_000:
        return min(int(saved), limit)
    return min(512, limit)


def _load_workdir(path: str, key: str) -> TrainedModel:
    if path.endswith("best"):
        logging.info("predicting with %s (the best dev checkpoint)", path)
    reader = CheckpointReader(path, key)
    try:
        run = reader.meta.get("config", {})
        data = run.get("data", {})
        cache = os.path.join(paths.cache_dir(), "tokenizers", reader.meta["tokenizer_fingerprint"])
        tokenizer = Tokenizer(
            reader.write_tokenizer(cache),
            language=data.get("language", "en"),
            lowercase=data.get("lowercase", True),
        )
        cfg, params, step = reader.model_config(), reader.params(), int(reader.step)
    finally:
        reader.close()
    if cfg.scan_layers:
        from bertjax.convert import unstack_layers

        cfg = cfg.replace(scan_layers=False)
        params = unstack_layers(cfg, params)
    loss, task_config = run.get("loss", {}), run.get("task", {})
    pooling, normalize = trained_pooling(run)
    columns = {
        "text_column": task_config.get("text_column", "text"),
        "text_pair_column": task_config.get("text_pair_column", ""),
        "tokens_column": task_config.get("tokens_column", "tokens"),
    }
    return TrainedModel(
        path,
        "workdir",
        cfg,
        params,
        tokenizer,
        _OBJECTIVE_TASKS.get(loss.get("objective", "mlm"), "fill_mask"),
        data.get("max_seq_length", 512),
        run=run,
        pooling=pooling,
        normalize=normalize,
        columns=columns,
        step=step,
    )


def trained_pooling(run: dict) -> tuple[tuple[str, ...], bool]:
    """(pooling modes, normalize) a run trained with, resolved as the embedding objective resolved
    them (`Embedding.from_config`): "auto" and an unset normalize are a sentence-transformers
    ``init_from``'s modules, else mean pooling, normalized."""
    loss = run.get("loss", {})
    pooling, normalize = loss.get("pooling") or "mean", loss.get("normalize")
    init = run.get("init_from") or ""
    if pooling == "auto" or normalize is None:
        modules = None
        if init and st_files.is_sentence_transformers_dir(init):
            modules = st_files.read_modules(init)
        elif init and not paths.exists(init):
            logging.warning(
                "config.init_from=%r, which the run's pooling or normalization came from, is not "
                "there: taking mean pooling, normalized",
                init,
            )
        if pooling == "auto":
            pooling = modules.pooling if modules else ("mean",)
        if normalize is None:
            normalize = modules.normalize if modules else True
    if isinstance(pooling, str):
        pooling = tuple(p.strip() for p in pooling.split(","))
    return check_pooling(tuple(pooling)), bool(normalize)


def fingerprint(path: str, key: str = "--model") -> str:
    """A hash of what `load` would read under ``path`` (each file's name, size and modification
    time; a workdir's latest checkpoint step), without reading the weights: another model, or
    the same directory trained further, gets another fingerprint."""
    form = form_of(path, key)
    if form == "workdir":
        path = workdir_checkpoint(path)
        reader = CheckpointReader(path, key)
        directory = paths.join(checkpoints_dir(reader.path), str(reader.step))
        reader.close()
    else:
        directory = path
    digest = hashlib.sha256(f"{form}\n{paths.resolve(directory)}\n".encode())
    root = paths.Path(directory)
    for file in sorted(_files(root)):
        stat = file.stat()
        digest.update(f"{file.relative_to(root)}\t{stat.length}\t{stat.mtime}\n".encode())
    return digest.hexdigest()[:16]


def _files(root):
    """Every file under ``root`` (epath does not glob ``**`` on object storage)."""
    folders = [root]
    while folders:
        for child in folders.pop().iterdir():
            if child.is_dir():
                folders.append(child)
            else:
                yield child
