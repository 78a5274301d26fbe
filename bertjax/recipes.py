"""Where the recipes (configs/*.py) lie: a checkout's configs/ beside the package, or the copy an
installed wheel carries as bertjax/configs/ (setup.py maps it there), so the commands' default
recipes (`python -m bertjax.compile`, `python -m bertjax.glue`) resolve without the repository.
Stdlib only: commands read it before their heavy imports."""

from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# A wheel's copy first, then a checkout's (editable installs and PYTHONPATH runs).
PLACES = (os.path.join(_PACKAGE, "configs"), os.path.join(os.path.dirname(_PACKAGE), "configs"))


def recipe_path(name: str) -> str:
    """The file of recipe ``name`` ("bert_tiny.py"; a ``:VARIANT`` suffix is kept), where it
    lies; the checkout's path when it lies nowhere (the loader then names it as missing)."""
    file, colon, variant = name.partition(":")
    found = next((p for p in PLACES if os.path.isfile(os.path.join(p, file))), PLACES[-1])
    return os.path.join(found, file) + colon + variant
