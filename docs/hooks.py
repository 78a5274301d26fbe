"""mkdocs hooks (mkdocs.yml): the generated reference pages (bertjax/reference/) join the site at
build time."""

from __future__ import annotations

import importlib

from mkdocs.structure.files import File

GENERATED = {
    "reference/config.md": "bertjax.reference.config_keys",
    "reference/batches.md": "bertjax.reference.batch_keys",
}


def on_files(files, config):
    for uri, module in GENERATED.items():
        text = importlib.import_module(module).markdown()
        files.append(File.generated(config, uri, content=text))
    return files
