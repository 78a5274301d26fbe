"""How bertjax lands where users install it.

The notebooks' install cell (`bertjax.install`) run as Colab runs it: in a fresh virtualenv that
already holds what Colab ships and the notebooks use (jax, jaxlib, torch, matplotlib,
transformers, tensorflow-datasets, gcsfs, at this environment's versions), with the repository
reached as a local path instead of GitHub; what it changed is read back from the virtualenv. The
wheel `python -m build` makes is then installed there and trains with the repository gone. That
virtualenv is built once per machine under ``BERTJAX_TEST_CACHE`` (default
~/.cache/bertjax/tests; ~40-90 s of pip's CPU) and copied for each run. The install plan for the
runtimes this host is not (GPU, TPU) is checked in-process.
"""

import fnmatch
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import types
import zipfile

import pytest
from helpers import xla_flags

from bertjax import install
from bertjax.training import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("BERTJAX_TEST_CACHE", os.path.expanduser("~/.cache/bertjax/tests"))
# What a Colab runtime ships that the notebooks use (the install must leave the first three be).
PREINSTALLED = (
    "jax", "jaxlib", "torch", "matplotlib", "transformers", "tensorflow-datasets", "gcsfs"
)  # fmt: skip
SOURCE = ("pyproject.toml", "setup.py", "README.md", "bertjax", "configs")  # what a wheel needs


def _install_cell(name: str) -> str:
    with open(os.path.join(ROOT, "colab", name), encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    return "".join(cells[0]["source"])


def _clean_env(**extra) -> dict:
    """This environment without what points at the repository or its interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def _versions(python: str, names) -> dict:
    program = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run([python, "-c", program, *names], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _base_venv() -> str:
    """A virtualenv holding PREINSTALLED at this environment's versions, made once (built aside,
    then renamed into place, so a half-built one is never used)."""
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in PREINSTALLED]
    key = hashlib.sha256(repr((sys.version, pins)).encode()).hexdigest()[:12]
    path = os.path.join(CACHE, f"colab-venv-{key}")
    if os.path.isfile(os.path.join(path, "ready")):
        return path
    building = f"{path}.building-{os.getpid()}"
    subprocess.run([sys.executable, "-m", "venv", building], check=True)
    python = os.path.join(building, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *pins], check=True, env=_clean_env())
    open(os.path.join(building, "ready"), "w").close()
    try:
        os.rename(building, path)
    except OSError:  # another run put one there first
        shutil.rmtree(building)
    return path


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A copy of the base virtualenv after the install cell ran in it: (python, source copy,
    the cell's result, the versions before)."""
    root = tmp_path_factory.mktemp("colab")
    venv = str(root / "venv")
    shutil.copytree(_base_venv(), venv, symlinks=True)
    python = os.path.join(venv, "bin", "python")
    source = root / "bertjax-local"  # the repository as a local path (a clone's files)
    ignore = shutil.ignore_patterns("__pycache__")
    source.mkdir()
    for name in SOURCE:
        if os.path.isdir(os.path.join(ROOT, name)):
            shutil.copytree(os.path.join(ROOT, name), source / name, ignore=ignore)
        else:
            shutil.copy(os.path.join(ROOT, name), source / name)
    before = _versions(python, PREINSTALLED)
    content = root / "content"  # Colab's working directory
    content.mkdir()
    result = subprocess.run(
        [python, "-c", _install_cell("quickstart.ipynb")], cwd=content, capture_output=True,
        text=True, env=_clean_env(BERTJAX_REPO=str(source)), timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return python, source, result, before


def test_both_notebooks_install_the_same_way():
    cell = _install_cell("quickstart.ipynb")
    assert cell == _install_cell("pretrain_tpu.ipynb")
    assert '"-m", "bertjax.install", "--extras=colab"' in cell


@pytest.mark.slow
def test_install_cell_keeps_the_runtimes_jax_and_torch(colab):
    python, _, result, before = colab
    assert _versions(python, PREINSTALLED) == before  # nothing Colab ships was replaced
    kept = ", ".join(f"{n} {before[n]}" for n in ("jax", "jaxlib", "torch"))
    assert f"bertjax install: runtime cpu; keeping {kept}\n" in result.stdout
    assert "bertjax and what it needs: pip install " in result.stdout
    added = re.search(r"added (\d+): (.*)", result.stdout)
    assert added and "bertjax 0.1.0" in added.group(2) and "flax " in added.group(2)
    assert "  changed: nothing\n" in result.stdout
    where = subprocess.run(
        [python, "-c", "import bertjax.trainer, bertjax; print(bertjax.__file__)"],
        capture_output=True, text=True, env=_clean_env(), cwd="/",
    )  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.startswith(os.path.dirname(os.path.dirname(python)))  # site-packages


@pytest.mark.slow
def test_the_wheel_installs_and_trains_without_the_repository(colab, tmp_path):
    python, source, _, before = colab
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path, source],
        capture_output=True, text=True, env=_clean_env(),
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = [str(tmp_path / n) for n in os.listdir(tmp_path) if n.endswith(".whl")]
    names = zipfile.ZipFile(wheel).namelist()
    # the recipes the commands default to travel inside the package; nothing else of the repo
    assert {"bertjax/configs/bert_tiny.py", "bertjax/configs/glue.py"} <= set(names)
    assert {n.split("/")[0] for n in names} == {"bertjax", "bertjax-0.1.0.dist-info"}
    install_wheel = [python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel]
    subprocess.run(install_wheel, check=True, env=_clean_env())
    shutil.rmtree(source)  # the repository is gone
    program = """
import json
from bertjax import glue, recipes, trainer
from bertjax.training.run_config import load_config_file
assert glue.DEFAULT_CONFIG.startswith(recipes.PLACES[0]), glue.DEFAULT_CONFIG
config = load_config_file(recipes.recipe_path("bert_tiny.py:smoke"))
config.progress_bar = False
print(json.dumps({"step": trainer.train_and_evaluate(config, "workdir")["step"]}))
"""
    run = subprocess.run(
        [python, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=_clean_env(XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"step": 3}
    assert _versions(python, PREINSTALLED) == before


COLAB_GPU = {  # what a Colab GPU runtime ships (versions as there; the plan reads only names)
    "jax": "0.10.2", "jaxlib": "0.10.2", "jax-cuda12-plugin": "0.10.2",
    "jax-cuda12-pjrt": "0.10.2", "torch": "2.8.0+cu126", "numpy": "2.0.2",
}  # fmt: skip


def test_plan_on_a_colab_gpu_installs_bertjax_alone_keeping_jax_plugin_and_torch():
    steps, keep = install.plan("gpu", COLAB_GPU, "0.10", "src[colab]")
    assert [s.requirements for s in steps] == [("src[colab]",)]
    assert keep == {k: v for k, v in COLAB_GPU.items() if k != "numpy"}


def test_plan_adds_the_runtimes_plugin_at_the_installed_jax():
    cpu_jax = {"jax": "0.10.2", "jaxlib": "0.10.2", "torch": "2.13.0+cpu"}
    for kind, piece in (("gpu", "jax[cuda12]==0.10.2"), ("tpu", "jax[tpu]==0.10.2")):
        steps, keep = install.plan(kind, cpu_jax, "0.10", "src")
        assert [s.requirements for s in steps] == [(piece,), ("src",)], kind
        assert keep == cpu_jax  # jax and jaxlib held at 0.10.2 while the plugin comes
    steps, _ = install.plan("tpu", {**cpu_jax, "libtpu": "0.0.42"}, "0.10", "src")
    assert len(steps) == 1  # libtpu there: bertjax alone


def test_plan_upgrades_an_old_jax_with_its_plugin_together_and_keeps_torch():
    old = {**COLAB_GPU, "jax": "0.7.2", "jaxlib": "0.7.2", "jax-cuda12-plugin": "0.7.2"}
    steps, keep = install.plan("gpu", old, "0.10", "src")
    assert steps[0].requirements == ("jax[cuda12]>=0.10",)
    assert "jax 0.7.2, older than bertjax needs (>= 0.10)" in steps[0].why
    assert "the CUDA plugin" in steps[0].why
    assert keep == {"torch": "2.8.0+cu126"}  # the jax family moves together; torch stays
    steps, _ = install.plan("cpu", {}, "0.10", "src")
    assert steps[0].requirements == ("jax>=0.10",) and steps[0].why.startswith("no jax")


def test_plan_reads_the_jax_bertjax_needs_from_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        import tomllib

        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert f"jax>={install.required_jax(ROOT)}" in dependencies
    assert install.release("2.13.0+cpu") == (2, 13, 0) < install.release("2.13.1")


def test_the_runtime_is_the_hosts_accelerator(monkeypatch):
    def present(*files):
        fake = types.SimpleNamespace(glob=lambda pattern: fnmatch.filter(files, pattern))
        monkeypatch.setattr(runtime, "glob", fake)
        return runtime.accelerator_kind()

    assert present() == "cpu"
    assert present("/dev/nvidia0", "/dev/nvidiactl") == "gpu"
    assert present("/dev/vfio/0") == "tpu" and present("/dev/accel0") == "tpu"
    assert runtime.accelerator_present() is True  # the last host had a TPU


def test_the_command_prints_its_plan_and_refuses_a_non_checkout(tmp_path, capsys):
    install.main(["--runtime=gpu", "--dry_run", "--extras=colab"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bertjax install: runtime gpu; keeping jax ")
    assert out[-3].endswith(f"pip install {ROOT}[colab]") and out[-1] == "  changed: nothing"
    with pytest.raises(SystemExit) as stopped:
        install.main([f"--checkout={tmp_path}", "--dry_run"])
    assert stopped.value.code == 2
    assert f"--checkout={tmp_path}: no pyproject.toml" in capsys.readouterr().err
