"""What `make_pipeline` prepares once per corpus: the tokenizer and the token store; as a
command, a sharded store on Apache Beam for corpora too large for one host
(bertjax/data/store/beam_prepare.py):

    python -m bertjax.data.prepare --config=CONFIG --output=URL [Beam pipeline options]

- Tokenizer: a given SentencePiece model or Hugging Face vocabulary (local or a URL), else a
  SentencePiece model trained on the training split and kept as WORKDIR/tokenizer/spm.model.
  With a workdir on cloud storage, process 0 trains it locally and uploads it; every host then
  reads that one file, so all hosts tokenize alike.
- Token store: built into the local cache (config.data.cache_dir, else $BERTJAX_CACHE_DIR, else
  bertjax-cache under the system temp dir) at ``stores/<key>``, where the key hashes what the
  store is made of: the tokenizer's fingerprint, the corpus (files with their sizes and
  modification times; the tfds dataset; CPython's version for the built-in corpus) and the
  held-out fraction. Each host builds or reuses its own copy (memmaps need local files); a second
  run on the same corpus and tokenizer, in any workdir, reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from bertjax import paths
from bertjax.data.store.memmap import FORMAT_VERSION, Store, prepare_store, token_shares
from bertjax.data.text import corpus as corpus_lib
from bertjax.data.text.sentences import CorpusStats, is_heldout
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece

TOKENIZER_FILE = "spm.model"  # WORKDIR/tokenizer/spm.model when bertjax trains the tokenizer


def corpus_description(c) -> str:
    corpus = corpus_lib.describe(c.corpus, c.corpus_format, c.text_feature)
    return f"{corpus} heldout={c.heldout_fraction}"


def documents(c, split: str | None, stats=None):
    """(doc_id, sentences) of the configured corpus; only one split's documents when `split` is
    given."""
    for doc_id, doc in corpus_lib.iter_documents(
        c.corpus,
        c.corpus_format,
        text_feature=c.text_feature,
        tfds_data_dir=c.tfds_data_dir,
        stats=stats,
    ):
        if split is None or (split == "eval") == is_heldout(doc_id, c.heldout_fraction):
            yield doc_id, doc


def _barrier(name: str, process_count: int) -> None:
    if process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def workdir_tokenizer(
    sentences, workdir: str, cache: str, process_index: int, process_count: int, **options
) -> str:
    """A SentencePiece model trained on ``sentences`` (an iterable, or a callable returning one;
    only consumed when training happens) and kept as WORKDIR/tokenizer/spm.model; a local path
    to it. ``options``: train_sentencepiece's (vocab_size, model_type, language, seed)."""

    def train(directory: str) -> str:
        return train_sentencepiece(
            sentences() if callable(sentences) else sentences, directory, **options
        )

    if not paths.is_url(workdir):  # local (or shared) disk: train in place
        return train(os.path.join(workdir, "tokenizer"))
    kept = paths.join(workdir, "tokenizer", TOKENIZER_FILE)
    if process_index == 0 and not paths.exists(kept):
        key = hashlib.sha256(kept.encode()).hexdigest()[:16]
        paths.upload(train(os.path.join(cache, "tokenizers", key)), kept)
    _barrier("bertjax-tokenizer", process_count)
    return paths.local_copy(kept, cache)


def load_tokenizer(config, workdir: str, process_index: int = 0, process_count: int = 1):
    """The configured tokenizer; trains a SentencePiece model into WORKDIR/tokenizer/ when none is
    given (see the module docstring for cloud-storage workdirs)."""
    c = config.data
    cache = paths.cache_dir(c.cache_dir)
    if c.hf_vocab:
        vocab = paths.local_copy(c.hf_vocab, cache)
        return Tokenizer(vocab, language=c.language, lowercase=c.lowercase)
    if c.tokenizer_model:
        return Tokenizer(paths.local_copy(c.tokenizer_model, cache), language=c.language)
    path = workdir_tokenizer(
        lambda: (s for _, doc in documents(c, "train") for s in doc),
        workdir,
        cache,
        process_index,
        process_count,
        vocab_size=c.vocab_size,
        model_type=c.tokenizer_type,
        language=c.language,
        seed=config.seed,
    )
    return Tokenizer(path, language=c.language)


def store_key(c, tokenizer: Tokenizer) -> str:
    """A hash of what a token store is made of (see the module docstring)."""
    if c.corpus == "builtin" or c.corpus.startswith("tfds:"):
        files = []
    else:
        files = [
            (path, os.path.getsize(path), os.stat(path).st_mtime_ns)
            for path in corpus_lib.expand_paths(c.corpus)
        ]
    parts = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.fingerprint(),
        "language": tokenizer.language,
        "corpus": corpus_description(c),
        "files": files,
        "tfds_data_dir": c.tfds_data_dir if c.corpus.startswith("tfds:") else "",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def load_store(config, tokenizer: Tokenizer, split: str) -> tuple[Store, Store]:
    """(the ``split`` store, the eval store), built into the local cache unless it is there."""
    c = config.data
    directory = os.path.join(paths.cache_dir(c.cache_dir), "stores", store_key(c, tokenizer))
    description = corpus_description(c)
    if not os.path.exists(os.path.join(directory, "meta.json")):
        stats = CorpusStats()
        prepare_store(
            directory,
            tokenizer,
            documents(c, None, stats),
            heldout_fraction=c.heldout_fraction,
            corpus_description=description,
            stats=stats,
            num_workers=c.num_workers,
        )
    stores = (
        Store(directory, split, tokenizer, description),
        Store(directory, "eval", tokenizer, description),
    )
    _report_shares(directory, stores[0].meta["splits"]["train"])
    return stores


def _report_shares(store: str, counts: dict) -> None:
    """Logs the store's [UNK] and special-token shares; a warning when [UNK] is common."""
    line, suspicious = token_shares(counts)
    if line:
        (logging.warning if suspicious else logging.info)("store %s: %s", store, line)


def store_tokenizer(config) -> Tokenizer:
    """The tokenizer of the sharded store config.data.store: the configured one (which must be
    the store's), else the store's own file."""
    from bertjax.data.store import shard_format

    c = config.data
    manifest = shard_format.read_manifest(c.store)
    cache = paths.cache_dir(c.cache_dir)
    if c.hf_vocab or c.tokenizer_model:
        tokenizer = load_tokenizer(config, "", 0, 1)
    else:
        kept = shard_format.join(c.store, manifest["tokenizer_file"])
        tokenizer = Tokenizer(
            paths.local_copy(kept, cache), language=c.language, lowercase=manifest["lowercase"]
        )
    shard_format.check_tokenizer(c.store, manifest, tokenizer)
    _report_shares(c.store, manifest["splits"]["train"])
    return tokenizer


if __name__ == "__main__":
    from bertjax.data.store import beam_prepare

    beam_prepare.main()
