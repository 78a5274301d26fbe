"""The run's token store, from its config: the local memmap store built in a cache
(config.data.cache_dir, else $BERTJAX_CACHE_DIR, else bertjax-cache under the system temp dir) at
``stores/<key>``, where the key hashes what the store is made of: the tokenizer's fingerprint,
the corpus (files with their sizes and versions: a local file's modification time, an object's
generation, a Hub file's commit; the tfds dataset; CPython's version for the built-in corpus),
how documents are named and the held-out fraction. Each host builds or reuses its own copy
(memmaps need local files; the processes of one host build it once, under a lock; files on
storage or the Hub are read from local copies, each fetched once); a second run on the same
corpus and tokenizer, in any workdir, reuses it. Or the sharded store
config.data.store (a URL), whose tokenizer is checked against the run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os

from bertjax import paths
from bertjax.data.store import shard_format
from bertjax.data.store.memmap import FORMAT_VERSION, Store, prepare_store, token_shares
from bertjax.data.text import corpus as corpus_lib
from bertjax.data.text.sentences import CorpusStats
from bertjax.data.tokenizer.configured import load_tokenizer
from bertjax.data.tokenizer.tokenizer import Tokenizer


def store_key(c, tokenizer: Tokenizer) -> str:
    """A hash of what a token store is made of (see the module docstring)."""
    parts = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.fingerprint(),
        "language": tokenizer.language,
        **corpus_lib.config_parts(c),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def load_store(config, tokenizer: Tokenizer, split: str) -> tuple[Store, Store]:
    """(the ``split`` store, the eval store), built into the local cache unless it is there."""
    c = config.data
    directory = os.path.join(paths.cache_dir(c.cache_dir), "stores", store_key(c, tokenizer))
    description = corpus_lib.config_description(c)
    meta = os.path.join(directory, "meta.json")
    if not os.path.exists(meta):
        with _host_lock(directory):  # other processes of this host wait, then reuse it
            if not os.path.exists(meta):
                stats = CorpusStats()
                prepare_store(
                    directory,
                    tokenizer,
                    corpus_lib.split_documents(c, None, stats),
                    heldout_fraction=c.heldout_fraction,
                    corpus_description=description,
                    stats=stats,
                    num_workers=c.num_workers,
                    forced_heldout=corpus_lib.forced_document(c),
                )
    stores = (
        Store(directory, split, tokenizer, description),
        Store(directory, "eval", tokenizer, description),
    )
    _report_shares(directory, stores[0].meta["splits"]["train"])
    return stores


@contextlib.contextmanager
def _host_lock(directory: str):
    """An exclusive lock on ``directory``.lock, held by one process of this host at a time."""
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _report_shares(store: str, counts: dict) -> None:
    """Logs the store's [UNK] and special-token shares; a warning when [UNK] is common."""
    line, suspicious = token_shares(counts)
    if line:
        (logging.warning if suspicious else logging.info)("store %s: %s", store, line)


def store_tokenizer(config, manifest: dict | None = None) -> Tokenizer:
    """The tokenizer of the sharded store config.data.store: the configured one (which must be
    the store's), else the store's own file; ``manifest``: the store's, read already."""
    c = config.data
    manifest = manifest or shard_format.read_manifest(c.store)
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
