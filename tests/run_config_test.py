"""The run config where it enters: ``--config PATH`` reads like ``--config=PATH``; every path a
config names is resolved once (``~``, relative to the current directory, URLs kept) and a missing
one is named in one line; every key of every recipe can be set on the command line."""

import os
import sys
import types

import ml_collections
import pytest
import warm_python
from absl import flags
from ml_collections import config_dict, config_flags

from bertjax import paths, trainer
from bertjax.interop.checkpoints import CheckpointReader
from bertjax.objectives import OBJECTIVES, validate_loss_config, with_objective
from bertjax.objectives.finetune import add_finetune_config
from bertjax.training.run_config import (
    check_config_overrides,
    config_path,
    define_config_flag,
    model_config,
    resolve_paths,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "bert_tiny.py")
GLUE = os.path.join(ROOT, "configs", "finetune_glue.py")
RECIPES = sorted(
    os.path.join(ROOT, "configs", f)
    for f in os.listdir(os.path.join(ROOT, "configs"))
    if f.endswith(".py")
)


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


# ---- every key can be set on the command line ----


def _parse(path: str, *overrides: str, checked: bool = False) -> ml_collections.ConfigDict:
    """The config train.py builds from ``--config=path`` and ``overrides``: the unknown-key check
    (unless ``checked``: done already), then ml_collections' own override machinery
    (config_flags with train.py's `define_config_flag`, locked)."""
    argv = ["train.py", f"--config={path}", *overrides]
    if not checked:
        check_config_overrides(argv, DEFAULT)
    values = flags.FlagValues()
    holder = define_config_flag("config", DEFAULT, "", flag_values=values, sys_argv=argv)
    values(argv)
    return holder.value


def _leaves(config: ml_collections.ConfigDict, prefix: str = ""):
    """(dotted key, value, declared type) of every leaf; a placeholder's type is its own."""
    for key in config.keys():
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value, config.get_type(key)


def _other_value(value, kind):
    """A value of type ``kind`` different from ``value`` (None: a placeholder's first value)."""
    if kind is bool:
        return not value
    if kind is int:
        return 1 if value is None else value + 1
    if kind is float:
        return 0.5 if value is None else value + 0.5
    if kind is str:
        return "other" if value != "other" else "another"
    if kind is tuple:  # same elements, another order and length
        return (*value[::-1], *value[:1]) if value else (1,)
    raise AssertionError(f"no command-line form for {kind}")


def _get(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def test_every_key_of_every_recipe_can_be_set_on_the_command_line():
    """Each leaf of each configs/*.py set to a value of its declared type (all of a recipe's
    leaves in one parse, and alone where that parse does not hold it); the parsed config holds
    exactly that value. A key whose default is a bare None (ml_collections cannot type it)
    fails here: such keys are typed placeholders."""
    count = 0
    for path in RECIPES:
        overrides = []
        for key, value, kind in _leaves(trainer.load_config_file(path)):
            if key == "loss.objective":  # a registered name (the next test chooses each one)
                continue
            new = _other_value(value, kind)
            overrides.append((key, new, repr(new) if kind is tuple else str(new)))
        # train.py's unknown-key check passes every key of the recipe (once, all together)
        check_config_overrides(
            ["train.py", f"--config={path}", *(f"--config.{k}={t}" for k, _, t in overrides)],
            DEFAULT,
        )
        # all of them in one parse (a recipe file exec'd and a flag built once, not per key);
        # a key that does not come out as given there (a reference tied to another key, an
        # error) is parsed alone, which is what the user's one override does
        try:
            together = _parse(path, *(f"--config.{k}={t}" for k, _, t in overrides), checked=True)
        except Exception:
            together = None
        for key, new, text in overrides:
            if together is not None:
                parsed = _get(together, key)
                if parsed == new and type(parsed) is type(new):
                    count += 1
                    continue
            try:
                parsed = _get(_parse(path, f"--config.{key}={text}", checked=True), key)
            except Exception as error:  # name the recipe and key, not just the parser's error
                raise AssertionError(f"{os.path.basename(path)}: --config.{key}={text}") from error
            assert parsed == new and type(parsed) is type(new), (path, key, parsed, new)
            count += 1
    assert count > 1500  # 19 recipes of ~100-150 keys each: the walk did walk them
    # The walk would see an untyped None: ml_collections refuses it.
    untyped = ml_collections.ConfigDict({"x": None, "y": config_dict.placeholder(str)})
    values = flags.FlagValues()
    argv = ["p", "--config.x=1"]
    with pytest.raises(flags.Error, match="config.x"):
        config_flags.DEFINE_config_dict("config", untyped, flag_values=values, sys_argv=argv)
        values(argv)


def test_every_objective_setting_is_a_key_once_the_command_line_chooses_the_objective():
    """``--config=configs/bert_tiny.py --config.loss.objective=X --config.loss.<setting>=v`` for
    every setting of every registered objective (each objective's in one parse): the unknown-key
    check passes, the parsed config holds v, `validate_loss_config` accepts it and X reads v. A
    misspelled setting still stops, listing X's settings among the keys; switching away from a
    recipe's objective drops the settings only it reads."""
    checked = 0
    for name, cls in sorted(OBJECTIVES.items()):
        loss = with_objective(trainer.load_config_file(DEFAULT), name).loss
        chosen = {}
        for key in cls.extra_config_keys:
            new = _other_value(loss[key], loss.get_type(key))
            chosen[key] = (new, repr(new) if isinstance(new, tuple) else str(new))
        overrides = [f"--config.loss.objective={name}"]
        overrides += [f"--config.loss.{key}={text}" for key, (_, text) in chosen.items()]
        check_config_overrides(["train.py", f"--config={DEFAULT}", *overrides], DEFAULT)
        config = _parse(DEFAULT, *overrides, checked=True)
        assert config.loss.objective == name
        validate_loss_config(config.loss)
        settings = cls.settings(config)
        for key, (new, _) in chosen.items():
            assert config.loss[key] == new and settings[key] == new, (name, key)
            checked += 1
        if chosen:
            key = next(iter(chosen))
            with pytest.raises(SystemExit, match=f"config.loss has no '{key}x'.*'{key}'"):
                check_config_overrides(["train.py", *overrides, f"--config.loss.{key}x=1"], DEFAULT)
    assert checked >= 20  # distill, electra, embedding, fine-tuning: the walk did walk them
    with pytest.raises(SystemExit, match="objective='mlm'.*one of .*'pretraining'"):
        check_config_overrides(["train.py", "--config.loss.objective=mlm"], DEFAULT)
    electra = os.path.join(ROOT, "configs", "electra_tiny.py")
    back = _parse(electra, "--config.loss.objective=pretraining")
    validate_loss_config(back.loss)
    assert "discriminator_weight" not in back.loss and back.loss.mlm_weight == 1.0


def test_optional_model_fields_from_the_command_line(tmp_path, small_spm):
    """The README's --config.model.matmul_dtype=bfloat16 and --config.model.attention_implementation
    =xla reach the model of a run (a 2-step train.py run, all settings given as flags); an
    unknown implementation is named."""
    shrink = [
        "--config.num_train_steps=2",
        "--config.batch_size=8",  # the 8 test devices
        "--config.data.max_seq_length=32",
        "--config.data.max_predictions=5",
        "--config.model.hidden_size=32",
        "--config.model.num_attention_heads=2",
        "--config.model.intermediate_size=64",
        "--config.optim.warmup_steps=1",
        "--config.log_every=1",
        "--config.eval_every=0",
        "--config.progress_bar=False",
        "--config.peak_flops_per_device=1e12",
        f"--config.data.tokenizer_model={small_spm}",
    ]
    chosen = ["--config.model.matmul_dtype=bfloat16", "--config.model.attention_implementation=xla"]
    config = _parse(DEFAULT, *chosen, *shrink)
    summary = trainer.train_and_evaluate(config, str(tmp_path))
    assert summary["step"] == 2 and summary["train/loss"] == summary["train/loss"]
    reader = CheckpointReader(str(tmp_path), "workdir")
    model = reader.meta["model_config"]
    reader.close()
    assert (model["matmul_dtype"], model["attention_implementation"]) == ("bfloat16", "xla")
    tokenizer = types.SimpleNamespace(
        vocab_size=400, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4
    )
    flash = _parse(DEFAULT, "--config.model.attention_implementation=flash")
    with pytest.raises(ValueError, match="config.model.attention_implementation 'flash'"):
        model_config(flash, tokenizer)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (  # the default recipe initializes a position table; RoPE has none
            ["--config.model.position_embedding_type=rope"],
            "config.model.position_embedding_type='rope' has no position table, so "
            "config.model.position_embedding_init='fourier' and "
            "config.model.local_attention_offsets=(-1, 1) do not apply",
        ),
        (
            [
                "--config.model.attention_implementation=splash",
                *["--config.model.attention_probs_dropout_prob=0.1"],
            ],
            "config.model.attention_implementation='splash': the splash kernel cannot serve "
            "layer 0's attention in training, dropout=True "
            "(config.model.attention_probs_dropout_prob=0.1)",
        ),
        (
            ["--config.model.attention_implementation=cpu_banded"],
            "the cpu_banded kernel cannot serve layer 0's attention in training, half_window=0 "
            "(banded attention is for local layers) (config.model.local_attention_window=0)",
        ),
        (
            ["--config.num_train_steps=50"],
            "config.optim.warmup_steps=100: warmup must end before total_steps (50 steps",
        ),
        (
            ["--config.loss.objective=embedding", "--config.optim.grad_accum_steps=2"],
            "config.optim.grad_accum_steps=2: the Embedding objective's loss is not a sum",
        ),
    ],
    ids=["rope-position-init", "splash-dropout", "banded-global", "warmup", "microbatches"],
)
def test_config_conflicts_are_refused_before_anything_is_built(tmp_path, overrides, message):
    """Conflicts between keys are named from the config alone, before a tokenizer, a store, a
    model or the workdir exists (they were found 4-11 s into a run, after those were built)."""
    config = _parse(DEFAULT, *overrides)
    with pytest.raises(ValueError) as raised:
        trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert message in str(raised.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "command,line",
    [
        (
            ["train.py", "--config=configs/finetune_glue.py", "--config.init_from=no/run"],
            "error: config.init_from='{cwd}/no/run' does not exist",
        ),
        (  # the chosen objective's setting reached the run (config_flags in train.py)
            [
                "train.py",
                "--config=configs/bert_tiny.py",
                "--config.loss.objective=distill",
                "--config.loss.teacher=no/teacher",
            ],
            "error: config.loss.teacher='{cwd}/no/teacher' does not exist",
        ),
        (
            ["-m", "bertjax.glue", "--glue_dir=no_glue", "--workdir=w"],
            "error: --glue_dir='{cwd}/no_glue' is not a directory",
        ),
        (
            ["-m", "bertjax.glue", "--workdir=w", "--config.init_from=~/no/run"],
            "error: config.init_from='{home}/no/run' does not exist",
        ),
    ],
    ids=["train", "train-objective-setting", "glue-dir", "glue-init-from"],
)
def test_a_missing_path_is_one_line_from_every_command(command, line, tmp_path):
    """Run from another directory: relative paths are the current directory's, ~ is expanded,
    and the one line names the setting and the resolved path (no traceback), exit status 2
    (bertjax/cli.py; the other commands' bad input: tests/commands_test.py)."""
    for name in ("train.py", "configs", "bertjax"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = dict(os.environ, BERTJAX_HUGEPAGE_MALLOC="0")
    result = warm_python.run([sys.executable, *command], cwd=tmp_path, env=env)
    expected = line.format(cwd=tmp_path, home=os.path.expanduser("~"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(expected), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
