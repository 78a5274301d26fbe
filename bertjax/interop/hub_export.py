"""A bertjax run as a folder ready for the Hugging Face Hub (`export`), and its upload (`push`).

The folder holds what a Hub user loads with one line:

- the transformers (PyTorch) class of the model's family and task: ``...ForPreTraining`` /
  ``...ForMaskedLM`` for a pretraining run, ``...ForSequenceClassification`` /
  ``...ForTokenClassification`` with the run's label names for a fine-tuning run (config.json,
  model.safetensors; `bertjax.convert.to_hf`); for an embedding run the sentence-transformers
  layout around the encoder (modules.json, 1_Pooling, 2_Normalize, sentence_bert_config.json);
- the tokenizer files (`bertjax.interop.tokenizer_export`: tokenizer.json and its configs);
- README.md, the model card (`bertjax.interop.model_card`) with the run's facts.

The model comes through the inference loader (`bertjax.inference.loading`): a workdir's best/
checkpoint when it has one, else its latest. The folder is written under a temporary name beside
``output`` and renamed when whole, so a failed export leaves no folder that looks finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil

from bertjax import convert, paths
from bertjax.inference import labels as labels_lib
from bertjax.inference import loading
from bertjax.interop import model_card, run_facts
from bertjax.interop import sentence_transformers as st_files
from bertjax.interop.tokenizer_export import write_tokenizer


@dataclasses.dataclass
class Exported:
    """What `export` wrote."""

    path: str
    task: str
    architecture: str
    parameters: int
    facts: run_facts.RunFacts


def _check_output(output: str) -> None:
    if paths.exists(output) and (not paths.isdir(output) or any(paths.Path(output).iterdir())):
        raise ValueError(
            f"--output={output!r} exists and is not an empty folder: give a new folder (an "
            "export never writes over files)"
        )


def _write_model(model: loading.TrainedModel, folder: str) -> None:
    """The transformers (or sentence-transformers) files of ``model`` in ``folder``."""
    cfg, params, task = model.cfg, model.params, model.task
    objective = model.run.get("loss", {}).get("objective", "pretraining")
    if objective == "electra":
        raise ValueError(
            f"--model={model.path!r} is an ELECTRA pretraining run: export its discriminator "
            "with bertjax.convert.to_hf(cfg, params, DIR) (it writes discriminator/ and "
            "generator/), or fine-tune it and export that run"
        )
    if task == "embed":
        convert.to_hf(cfg, {"bert": params["bert"]}, folder)
        st_files.write_modules(
            cfg,
            folder,
            pooling=model.pooling,
            normalize=model.normalize,
            max_seq_length=model.max_seq_length,
        )
        return
    if task in ("classify", "tag"):
        heads = {k: v for k, v in params.items() if k in ("bert", "classifier", "electra_head")}
        convert.to_hf(cfg, heads, folder, token_classification=task == "tag")
        _name_labels(folder, labels_lib.label_names(model, task))
        return
    convert.to_hf(cfg, params, folder)


def _name_labels(folder: str, names: list[str]) -> None:
    """config.json's id2label/label2id with the run's label names (regression: none)."""
    path = paths.join(folder, "config.json")
    config = json.loads(paths.read_text(path))
    if names:
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    else:
        config["problem_type"] = "regression"
    paths.write_text(path, json.dumps(config, indent=2, sort_keys=True))


def _parameters(folder: str) -> int:
    """Parameters in the folder's model.safetensors (what a user downloads)."""
    from safetensors import safe_open

    with safe_open(paths.local_copy(paths.join(folder, "model.safetensors")), "np") as f:
        return sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())


def export(
    model_dir: str,
    output: str,
    *,
    license: str = "apache-2.0",
    base_model: str = "",
    name: str = "",
) -> Exported:
    """Writes the Hub-ready folder of the bertjax run in ``model_dir`` at ``output`` (module
    docstring); ``name``: the model's name in its card (default: the folder's)."""
    _check_output(output)
    model = loading.load(model_dir)
    if model.form != "workdir":
        raise ValueError(
            f"--model={model_dir!r} is a {model.form} directory already; export takes a bertjax "
            "workdir (the folder a training run wrote)"
        )
    facts = run_facts.gather(model, run_facts.workdir_of(model.path))
    local = not paths.is_url(output)
    folder = f"{output.rstrip('/')}.partial-{os.getpid()}" if local else output
    if local:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        _write_model(model, folder)
        write_tokenizer(
            model.tokenizer,
            folder,
            max_length=min(model.max_seq_length, model.limit),
            token_types=model.cfg.type_vocab_size > 0,
        )
        config = json.loads(paths.read_text(paths.join(folder, "config.json")))
        architecture = (config.get("architectures") or [config.get("model_type", "")])[0]
        parameters = _parameters(folder)
        card = model_card.model_card(
            facts,
            name=name or os.path.basename(output.rstrip("/")),
            task=model.task,
            family=config.get("model_type", model.cfg.model_type),
            architecture=architecture,
            parameters=parameters,
            license=license,
            base_model=base_model,
        )
        paths.write_text(paths.join(folder, "README.md"), card)
        if local:
            if os.path.isdir(output):
                os.rmdir(output)  # empty (checked above)
            os.replace(folder, output)
    except BaseException:
        if local:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return Exported(output, model.task, architecture, parameters, facts)


def push(folder: str, repo_id: str, *, private: bool = False, message: str = "") -> str:
    """Uploads ``folder`` to the Hub model repository ``repo_id`` (made if missing) in one
    commit, through huggingface_hub's `HfApi` (its endpoint HF_ENDPOINT, its token HF_TOKEN or
    the saved login); returns the commit's URL."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise ValueError("--push_to needs huggingface_hub: pip install 'bertjax[hub]'") from None
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=folder,
            repo_id=repo_id,
            commit_message=message or "bertjax export",
        )
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "no answer"
        raise ValueError(
            f"--push_to={repo_id!r}: the Hub answered {status} ({str(error).splitlines()[0]}): "
            "check the name and your token (HF_TOKEN or `hf auth login`)"
        ) from None
    return commit.commit_url
