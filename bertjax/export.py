"""Export a bertjax run as a folder ready for the Hugging Face Hub, and optionally push it.

    python -m bertjax.export --model=WORKDIR --output=DIR [--license=apache-2.0]
        [--base_model=OWNER/NAME] [--push_to=OWNER/NAME [--private]]

``--model`` is a pretraining or fine-tuning workdir (its best/ checkpoint when it has one). DIR
gets the transformers (PyTorch) model of the run's family and task in safetensors, or the
sentence-transformers layout for an embedding run, the tokenizer files, and README.md: the model
card, whose YAML metadata names the library, license, datasets, evaluation results (the Hub's
model-index form) and the run's steps, tokens and hardware. ``--push_to`` then uploads DIR to
that Hub model repository (made if missing) in one commit with huggingface_hub's upload call;
HF_TOKEN (or ``hf auth login``) authenticates, HF_ENDPOINT names another Hub. The work is done
in bertjax/interop/hub_export.py. Bad input stops with one line (bertjax/cli.py).
"""

from __future__ import annotations

from bertjax import cli, paths
from bertjax.interop.hub_export import export, push

__all__ = ["export", "main", "push"]


def _run(flags, _) -> None:
    cli.require(flags, "model", "output")
    if not paths.isdir(flags.model):
        cli.fail(f"--model={flags.model!r} is not a directory (a bertjax workdir)")
    if flags.private and not flags.push_to:
        cli.fail("--private needs --push_to=OWNER/NAME")
    if flags.push_to and flags.push_to.count("/") != 1:
        cli.fail(f"--push_to={flags.push_to!r}: a Hub model repository is OWNER/NAME")
    result = export(
        flags.model,
        flags.output,
        license=flags.license,
        base_model=flags.base_model,
        name=flags.push_to,
    )
    print(
        f"wrote {result.path}: {result.architecture}, {result.parameters:,} parameters, "
        "the tokenizer and the model card README.md"
    )
    if flags.push_to:
        url = push(result.path, flags.push_to, private=flags.private)
        print(f"pushed to {flags.push_to}: {url}")


def define_flags():
    """The command's flags, on a `flags.FlagValues` of its own (`bertjax.cli.new_flags`)."""
    return cli.new_flags(
        ("model", None, "a bertjax workdir (pretraining or fine-tuning run)"),
        ("output", None, "the folder to write (new or empty)"),
        ("license", "apache-2.0", "the model card's license (a Hub license id)"),
        ("base_model", "", "the Hub model the run started from, for the card (OWNER/NAME)"),
        ("push_to", "", "upload the folder to this Hub model repository (OWNER/NAME)"),
        ("private", False, "--push_to: make the repository private when it is new"),
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m bertjax.export` (the module docstring's flags)."""
    cli.run(_run, argv, define_flags(), __doc__)


if __name__ == "__main__":
    from bertjax.training import runtime

    runtime.default_to_cpu_without_accelerator()  # no TPU runtime start-up where libtpu is
    main()
