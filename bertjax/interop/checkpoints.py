"""bertjax checkpoints read without the trainer, and the tokenizer's place in their meta.

A checkpoint step holds ``state`` (step, params, opt_state; see `bertjax.training.checkpoint`,
which writes them) and ``meta`` (JSON: run config, model config, the tokenizer file and its
fingerprint, the data fingerprint). `CheckpointReader` opens the latest complete step of a
workdir read-only: what fine-tuning ``init_from``, a distillation teacher and diffusion sampling
need, with errors that name the setting the path came from.
"""

from __future__ import annotations

import base64
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax import paths
from bertjax.modeling.bert_config import BertConfig

ITEMS = ("state", "meta")


def tokenizer_meta(tokenizer) -> dict:
    """The tokenizer's file (base64) and fingerprint, so a checkpoint is usable on its own."""
    with open(tokenizer.path, "rb") as f:
        data = f.read()
    return {
        "tokenizer_file": os.path.basename(tokenizer.path),
        "tokenizer_bytes": base64.b64encode(data).decode("ascii"),
        "tokenizer_fingerprint": tokenizer.fingerprint(),
    }


def write_tokenizer(meta: dict, directory: str) -> str:
    """Writes the tokenizer stored in a checkpoint's meta into ``directory`` (whole or not at
    all: workers sharing a cache directory never read half of it); returns its path."""
    path = os.path.join(directory, meta["tokenizer_file"])
    paths.write_bytes(path, base64.b64decode(meta["tokenizer_bytes"]))
    return path


def require_dir(path: str, key: str) -> None:
    """Stops with one line naming the setting when ``path`` is not a directory."""
    if not paths.isdir(path):
        raise paths.MissingPathError(
            f"{key}={path!r} is not a directory (a bertjax workdir, its checkpoints/ dir, "
            "or a Hugging Face model dir)"
        )


def checkpoints_dir(path: str) -> str:
    """The checkpoints directory of a bertjax workdir (or the directory itself)."""
    sub = paths.join(path, "checkpoints")
    return sub if paths.isdir(sub) else path


class CheckpointReader:
    """The latest complete checkpoint under a bertjax workdir (or its checkpoints/ dir), read-only.

    ``key`` names the setting the path came from (e.g. "config.init_from") in error messages.
    """

    def __init__(self, path: str, key: str):
        path = paths.resolve(path, key)  # orbax takes absolute paths (or URLs) only
        require_dir(path, key)
        self.path, self.key = path, key
        self.directory = checkpoints_dir(path)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(read_only=True),
            item_names=ITEMS,
        )
        self.step = self._manager.latest_step()
        if self.step is None:
            raise paths.MissingPathError(
                f"{key}={path!r}: no complete bertjax checkpoint in {self.directory}"
            )
        args = ocp.args.Composite(meta=ocp.args.JsonRestore())
        self.meta = self._manager.restore(self.step, args=args)["meta"]
        if "model_config" not in self.meta or "tokenizer_bytes" not in self.meta:
            raise ValueError(
                f"{key}={path!r}: checkpoint {self.directory}/{self.step} has no model config or "
                "tokenizer in its meta; is it a bertjax pretraining checkpoint?"
            )

    def model_config(self, **overrides) -> BertConfig:
        return BertConfig.from_dict({**self.meta["model_config"], **overrides})

    def write_tokenizer(self, directory: str) -> str:
        """The checkpoint's tokenizer file, written into ``directory``; returns its path."""
        return write_tokenizer(self.meta, directory)

    def params(self) -> dict:
        """The saved params as host numpy arrays, whichever devices and processes saved them (a
        pod's checkpoint reads on one CPU: restoring onto the saved shardings would not)."""
        path = paths.join(self.directory, str(self.step), "state")
        checkpointer = ocp.PyTreeCheckpointer()
        tree = checkpointer.metadata(path).item_metadata.tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return checkpointer.restore(path, restore_args=as_numpy)["params"]

    def close(self) -> None:
        self._manager.close()
