"""The run config where it enters: ``--config PATH`` reads like ``--config=PATH``; every path a
config names is resolved once (``~``, relative to the current directory, URLs kept) and a missing
one is named in one line."""

import os

import pytest

from bertjax import paths, trainer
from bertjax.objectives.finetune import add_finetune_config
from bertjax.training.run_config import check_config_overrides, config_path, resolve_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "bert_tiny.py")
GLUE = os.path.join(ROOT, "configs", "finetune_glue.py")


def test_config_path_with_a_space_or_an_equals_sign():
    assert config_path(["train.py"], DEFAULT) == DEFAULT
    assert config_path(["train.py", f"--config={GLUE}"], DEFAULT) == GLUE
    assert config_path(["train.py", "--config", GLUE, "--workdir=w"], DEFAULT) == GLUE
    assert config_path(["train.py", f"--config={GLUE}:arg"], DEFAULT) == GLUE
    # A key only the fine-tuning recipe has is valid after either form, unknown without it.
    for form in ([f"--config={GLUE}"], ["--config", GLUE]):
        check_config_overrides(["train.py", *form, "--config.task.source=files"], DEFAULT)
    with pytest.raises(SystemExit, match="config.task"):
        check_config_overrides(["train.py", "--config.task.source=files"], DEFAULT)


def test_paths_are_resolved_once_and_a_missing_one_is_named(tmp_path, monkeypatch):
    (tmp_path / "pre").mkdir()
    (tmp_path / "train.tsv").write_text("text\tlabel\n")
    monkeypatch.chdir(tmp_path)
    config = add_finetune_config(trainer.default_run_config(), "classification", num_labels=2)
    config.init_from = "pre"
    config.task.train_file = "./train.tsv"
    config.data.corpus = "docs/*.txt, more.txt"
    config.data.cache_dir = "~/bertjax-cache"
    resolved = resolve_paths(config)
    assert resolved.init_from == str(tmp_path / "pre")
    assert resolved.task.train_file == str(tmp_path / "train.tsv")
    assert resolved.data.corpus == f"{tmp_path}/docs/*.txt,{tmp_path}/more.txt"
    assert resolved.data.cache_dir == os.path.expanduser("~/bertjax-cache")
    assert config.init_from == "pre"  # the caller's config is left as it was
    config.init_from = "gs://bucket/run"  # URLs stay URLs (not checked here: no network)
    assert paths.resolve(config.init_from) == "gs://bucket/run"
    assert paths.resolve("file:///tmp/x") == "/tmp/x"
    config.init_from = "no/such/run"
    with pytest.raises(paths.MissingPathError) as error:
        resolve_paths(config)
    assert str(error.value) == f"config.init_from={str(tmp_path / 'no/such/run')!r} does not exist"
