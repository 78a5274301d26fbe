"""bertjax onto the runtime this process runs on, keeping what the runtime ships:
``python -m bertjax.install [--extras=colab]`` from a checkout (the notebooks' first cell runs it
on Colab; README: "Colab").

The runtime is the host's accelerator (`training.runtime.accelerator_kind`: a TPU or GPU device
file, else CPU). A runtime such as Colab's ships jax, jaxlib, JAX's plugin for its accelerator
(the CUDA plugin, libtpu) and torch, built for it; `pip install` of a package that only names
``jax>=...`` would leave them be, but a resolver that upgrades one of them (and a CPU jaxlib
beside a CUDA plugin) leaves JAX on the CPU. So every pip run here is given the installed
versions of those packages as constraints (`RUNTIME_PACKAGES`), and the only changes to them are:

- the runtime's JAX plugin added where it is missing (a GPU without the CUDA plugin, a TPU
  without libtpu), at the installed jax's version;
- jax older than bertjax needs (pyproject.toml's ``jax>=``): jax, jaxlib and the runtime's
  plugin upgraded together (``jax``, ``jax[cuda12]`` or ``jax[tpu]``), said as such.

Then bertjax (not editable: a running Jupyter kernel imports a regular install at once, not an
editable one) with ``--extras``. It prints what it found, each pip command and why, and what
changed. Standard library only: it runs before bertjax's dependencies are there (argparse, not
`bertjax.cli`, which needs absl).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile

from bertjax.training import runtime

# What a runtime ships built for itself: jax's pieces (any CUDA major's plugin) and torch.
JAX_PACKAGES = re.compile(r"jax|jaxlib|libtpu|jax-cuda\d+-(plugin|pjrt)")
RUNTIME_PACKAGES = re.compile(rf"{JAX_PACKAGES.pattern}|torch")
# The pip requirement that brings jax, jaxlib and the runtime's plugin together.
JAX_FOR = {"cpu": "jax", "gpu": "jax[cuda12]", "tpu": "jax[tpu]"}
PLUGIN = {"gpu": "the CUDA plugin", "tpu": "libtpu"}
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Step:
    """One pip install: why, and its requirements."""

    why: str
    requirements: tuple


def _name(distribution) -> str:
    return re.sub(r"[-_.]+", "-", distribution.metadata["Name"]).lower()


def installed() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter sees."""
    found = {}
    for distribution in importlib.metadata.distributions():  # the first on sys.path is imported
        found.setdefault(_name(distribution), distribution.version)
    return found


def release(version: str) -> tuple[int, ...]:
    """A version's release numbers: (0, 10, 2) for 0.10.2, 2.13.0+cpu and 0.10.2rc1 alike."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def required_jax(checkout: str) -> str:
    """The lowest jax bertjax takes: the ``jax>=`` of the checkout's pyproject.toml."""
    with open(os.path.join(checkout, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'"jax>=([\d.]+)"', f.read())
    if match is None:
        raise SystemExit(f"{checkout}/pyproject.toml: no jax>=VERSION dependency")
    return match.group(1)


def plan(kind: str, have: dict, minimum: str, target: str) -> tuple[list[Step], dict]:
    """The pip installs for runtime ``kind`` ("cpu", "gpu", "tpu") where ``have`` is installed:
    (steps, the runtime packages each step keeps at their versions)."""
    keep = {name: v for name, v in have.items() if RUNTIME_PACKAGES.fullmatch(name)}
    jax, steps = have.get("jax"), []
    if jax is None or release(jax) < release(minimum):
        found = "no jax" if jax is None else f"jax {jax}, older than bertjax needs (>= {minimum})"
        pieces = "jax and jaxlib" + (f" and {PLUGIN[kind]}" if kind in PLUGIN else "")
        why = f"{found}: {pieces} installed together"
        steps.append(Step(why, (f"{JAX_FOR[kind]}>={minimum}",)))
        keep = {name: v for name, v in keep.items() if not JAX_PACKAGES.fullmatch(name)}
    elif kind == "gpu" and not any(re.fullmatch(r"jax-cuda\d+-plugin", name) for name in have):
        steps.append(Step(f"a GPU, no CUDA plugin: added at jax {jax}", (f"jax[cuda12]=={jax}",)))
    elif kind == "tpu" and "libtpu" not in have:
        steps.append(Step(f"a TPU, no libtpu: added at jax {jax}", (f"jax[tpu]=={jax}",)))
    steps.append(Step("bertjax and what it needs", (target,)))
    return steps, keep


def changes(before: dict, after: dict) -> tuple[list, list]:
    """(added "name version" items, changed "name old -> new" items)."""
    added = [f"{n} {v}" for n, v in sorted(after.items()) if n not in before]
    changed = [f"{n} {before[n]} -> {v}" for n, v in sorted(after.items()) if before.get(n, v) != v]
    return added, changed


def install(kind: str, checkout: str, extras: str, dry_run: bool = False) -> list[Step]:
    """Runs the plan on this interpreter; prints it and what changed."""
    target = checkout + (f"[{extras}]" if extras else "")
    before = installed()
    steps, keep = plan(kind, before, required_jax(checkout), target)
    shown = ", ".join(f"{n} {v}" for n, v in sorted(keep.items())) or "none installed"
    print(f"bertjax install: runtime {kind}; keeping {shown}", flush=True)
    for step in steps:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
            constraints.write("".join(f"{n}=={v}\n" for n, v in keep.items()))
        command = [sys.executable, "-m", "pip", "install", "-q", *step.requirements]
        command += ["-c", constraints.name]
        print(f"  {step.why}: pip install {' '.join(step.requirements)}", flush=True)
        try:
            if not dry_run:
                subprocess.run(command, check=True)
        finally:
            os.unlink(constraints.name)
        keep = {n: v for n, v in installed().items() if RUNTIME_PACKAGES.fullmatch(n)}
    added, changed = changes(before, installed())
    print(f"  added {len(added)}: {', '.join(added) or 'nothing'}")
    print(f"  changed: {', '.join(changed) or 'nothing'}", flush=True)
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax.install", description=__doc__)
    parser.add_argument("--extras", default="", help="extras of bertjax to add, e.g. colab")
    parser.add_argument(
        "--runtime", choices=("auto", "cpu", "gpu", "tpu"), default="auto",
        help="the accelerator to install for (auto: the host's device files)",
    )  # fmt: skip
    parser.add_argument("--checkout", default=CHECKOUT, help="the bertjax source to install")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, install nothing")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.checkout, "pyproject.toml")):  # bad input: status 2
        parser.error(f"--checkout={args.checkout}: no pyproject.toml; run it from a checkout")
    kind = runtime.accelerator_kind() if args.runtime == "auto" else args.runtime
    install(kind, os.path.abspath(args.checkout), args.extras, args.dry_run)


if __name__ == "__main__":
    main()
