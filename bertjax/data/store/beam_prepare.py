"""Preparing a sharded store on Apache Beam (`pip install 'bertjax[beam]'`).

    python -m bertjax.data.prepare --config=configs/bert_base.py --output=gs://BUCKET/store \\
        [--config.data.corpus='gs://BUCKET/text/*.jsonl' --config.data.corpus_format=jsonl] \\
        [Beam pipeline options: --runner=DataflowRunner --project=... --region=... |
         --direct_num_workers=8 --direct_running_mode=multi_processing (the default runner)]

Steps: (1) the driver lists the units of work (bertjax/data/store/shard_writer.py) and fixes the
tokenizer: the configured one, else a SentencePiece model trained on sentences drawn from every
unit, and copies it to OUTPUT/tokenizer/; (2) Beam tokenizes the units in parallel, each into
its own shards and record; (3) one last Beam step writes the manifest from all records. Files
are read and written through fsspec (gcsfs for gs://), so Beam's own I/O connectors are not
needed. A rerun of a killed job keeps every finished unit.
"""

from __future__ import annotations

import json
import math
import os

from bertjax import paths
from bertjax.data.store import shard_format as fmt
from bertjax.data.store import shard_writer
from bertjax.data.text import corpus as corpus_lib

SAMPLE_SENTENCES = 200_000  # sentences drawn across all units to train a SentencePiece model


def _sample_sentences(c, items: list[dict], spec: dict):
    """Up to SAMPLE_SENTENCES sentences, the first ones of every unit in equal shares."""
    share = max(1, math.ceil(SAMPLE_SENTENCES / max(1, len(items))))
    for item in items:
        taken = 0
        for _, doc in shard_writer.item_documents(spec, item, corpus_lib.CorpusStats()):
            yield from doc[: share - taken]
            taken += min(len(doc), share - taken)
            if taken >= share:
                break


def make_spec(config, output: str, items: list[dict]) -> dict:
    """What every worker needs (plain JSON values); fixes and uploads the tokenizer."""
    from bertjax.data.tokenizer import Tokenizer, train_sentencepiece

    c = config.data
    output = paths.resolve(output).rstrip("/")
    cache = paths.cache_dir(c.cache_dir)
    spec = {
        "output": output,
        "corpus": corpus_lib.describe(c.corpus, c.corpus_format, c.text_feature),
        "corpus_format": c.corpus_format,
        "text_feature": c.text_feature,
        "tfds_data_dir": c.tfds_data_dir,
        "heldout_fraction": c.heldout_fraction,
        "language": c.language,
        "lowercase": c.lowercase,
        "shard_bytes": c.shard_bytes,
        "block_tokens": c.block_tokens,
    }
    given = c.hf_vocab or c.tokenizer_model
    local = paths.local_copy(paths.resolve(given, "config.data.tokenizer_model", must_exist=True),
                             cache) if given else ""  # fmt: skip
    name = os.path.basename(local) if given else "spm.model"
    kept = fmt.join(output, "tokenizer", name)
    existing = fmt.read_file(kept)
    if not given and existing is None:
        directory = os.path.join(cache, "tokenizers", f"prepare-{os.getpid()}")
        local = train_sentencepiece(
            _sample_sentences(c, items, spec),
            directory,
            vocab_size=c.vocab_size,
            model_type=c.tokenizer_type,
            language=c.language,
            seed=config.seed,
        )
    if local:
        with open(local, "rb") as f:
            data = f.read()
        if existing is not None and existing != data:
            raise fmt.StoreError(
                f"{kept} holds another tokenizer than {given}: this output was prepared with "
                "it; use another --output (or delete that store)"
            )
        if existing is None:
            fmt.write_file(kept, data)
    else:
        local = paths.local_copy(kept, cache)
    tokenizer = Tokenizer(local, language=c.language, lowercase=c.lowercase)
    spec.update(
        tokenizer_file=f"tokenizer/{name}",
        tokenizer_fingerprint=tokenizer.fingerprint(),
        vocab_size=tokenizer.vocab_size,
        sep_id=tokenizer.sep_id,
        token_dtype=fmt.token_dtype(tokenizer.vocab_size).name,
    )
    return spec


def _prepare_item_fn():
    import apache_beam as beam

    class PrepareItem(beam.DoFn):
        """Tokenizes one unit of work into shards; yields its record."""

        def __init__(self, spec: dict):
            self.spec = spec

        def setup(self):
            self.tokenizer = shard_writer.local_tokenizer(self.spec)

        def process(self, item: dict):
            yield shard_writer.prepare_item(self.spec, item, self.tokenizer)

    return PrepareItem


def run(config, output: str, beam_args: list[str] = ()) -> dict:
    """Prepares the corpus of ``config`` into a sharded store at ``output``; its manifest."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise ImportError(
            "python -m bertjax.data.prepare needs Apache Beam: pip install 'bertjax[beam]'"
        ) from None
    from bertjax.data import data_config

    data_config.validate(config)
    items = shard_writer.work_items(config.data)
    spec = make_spec(config, output, items)
    try:
        manifest = fmt.read_manifest(spec["output"])
    except fmt.StoreError:
        manifest = None
    if manifest is not None:
        if manifest["tokenizer_fingerprint"] != spec["tokenizer_fingerprint"]:
            raise fmt.StoreError(
                f"{output} already holds a store made with another tokenizer: use another --output"
            )
        return manifest  # complete already
    options = PipelineOptions(list(beam_args) or ["--runner=DirectRunner"])
    with beam.Pipeline(options=options) as pipeline:
        records = (
            pipeline
            | "units" >> beam.Create(items)
            | "spread" >> beam.Reshuffle()
            | "tokenize" >> beam.ParDo(_prepare_item_fn()(spec))
        )
        _ = (
            records
            | "gather" >> beam.combiners.ToList()
            | "manifest" >> beam.Map(shard_writer.write_manifest, spec)
        )
    return fmt.read_manifest(spec["output"])


def main(argv=None) -> None:
    """The command line: --config=FILE --output=URL, every other flag goes to Beam (one that
    Beam does not know either is an error; bad input is one line, bertjax/cli.py)."""
    import sys

    from bertjax import cli

    # the command's face reads a recipe as train.py does (recipes import the trainer anyway)
    from bertjax.training.run_config import check_config_overrides, define_config_flag

    argv = list(sys.argv if argv is None else argv)
    if any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
        check_config_overrides(argv, "")  # a misspelled --config.KEY: one line, as train.py
    fv = cli.new_flags(("output", None, "where the store goes: a path or gs://, s3:// URL"))
    define_config_flag("config", None, "config file (configs/*.py)", fv, sys_argv=argv)

    def prepare(fv, rest):
        cli.require(fv, "config", "output")
        manifest = run(fv.config, fv.output, cli.beam_options(rest[1:], "bertjax.data.prepare"))
        splits = manifest["splits"].items()
        counts = {s: {k: v for k, v in d.items() if k != "shards"} for s, d in splits}
        print(json.dumps({"store": fv.output, "splits": counts}))

    cli.run(prepare, argv, fv, __doc__, known_only=True)
