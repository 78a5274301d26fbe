"""The package, and the recipes (configs/) inside it as bertjax/configs/, so that an installed wheel
carries the files its commands default to (`bertjax.recipes`); pyproject.toml holds the rest."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["bertjax*"]), "bertjax.configs"],
    package_dir={"bertjax.configs": "configs"},
)
