"""A run's Hub corpus fixed at its start: every hf:// entry of config.data.corpus resolved to the
commit its revision names (and, without a glob, to the files of the card's subset and split),
listed once, and recorded in WORKDIR/corpus.json, so that a resumed or repeated run in that
workdir reads the same bytes even after the branch moved, without asking the Hub again.

Process 0 resolves and lists; the other processes of a pod get its answer (a broadcast over
JAX's distributed runtime, no shared disk needed), and data worker processes read the record, so
the listing requests of a run do not grow with its processes. The record, one JSON object:

    {"corpus": as given, "hf_subset": ..., "hf_split": ..., "pinned": the hf:// URLs at their
     commits, comma-separated, "files": {pinned URL: [[file URL, bytes], ...]}}
"""

from __future__ import annotations

import json
import logging

import numpy as np

from bertjax import paths
from bertjax.data.text import corpus_files, hub

RECORD = "corpus.json"


def uses_hub(c) -> bool:
    return any(hub.is_hub(part) for part in corpus_files.parts(c.corpus))


def pinned_config(config, workdir: str | None, process_index: int = 0):
    """``config`` with config.data.corpus at the commits recorded in ``workdir`` (or resolved
    now, and recorded); the files listed, known to this process. Unchanged without hf://."""
    c = config.data
    if not uses_hub(c):
        return config
    record_url = paths.join(workdir, RECORD) if workdir else None
    record = _read(record_url) if record_url else None
    if record is None or not _same(record, c):
        record = None
    import jax

    alone = jax.process_count() == 1  # (a test's hosts simulated in one process resolve alike)
    payload = None
    if record is not None:
        payload = record  # read by every process that sees it: no request
    elif process_index == 0 or alone:
        payload = _resolve(c)
    payload = payload if alone else broadcast(payload)
    if record is None and process_index == 0 and record_url:
        paths.write_text(record_url, json.dumps(payload, indent=1))
        logging.warning("corpus %s pinned: %s (recorded in %s)", c.corpus, payload["pinned"],
                        record_url)  # fmt: skip
    for url, listed in payload["files"].items():
        hub.remember(url, listed)
    pinned = config.copy_and_resolve_references()
    pinned.data.corpus, pinned.data.hf_subset, pinned.data.hf_split = payload["pinned"], "", "train"
    return pinned


def _same(record: dict, c) -> bool:
    """Whether ``record`` pins this corpus (as given, or already pinned: a worker's config)."""
    given = (record.get("corpus"), record.get("hf_subset"), record.get("hf_split"))
    return given == (c.corpus, c.hf_subset, c.hf_split) or record.get("pinned") == c.corpus


def _resolve(c) -> dict:
    pinned = [
        hub.pin(part, c.hf_subset, c.hf_split) if hub.is_hub(part) else part
        for part in corpus_files.parts(c.corpus)
    ]
    files = {url: hub.files(url) for part in pinned for url in part.split(",") if hub.is_hub(url)}
    return {
        "corpus": c.corpus,
        "hf_subset": c.hf_subset,
        "hf_split": c.hf_split,
        "pinned": ",".join(pinned),
        "files": files,
    }


def _read(url: str) -> dict | None:
    try:
        return json.loads(paths.read_text(url)) if paths.exists(url) else None
    except ValueError:  # a record cut short: resolved again
        return None


def broadcast(payload: dict | None) -> dict:
    """Process 0's ``payload`` (JSON values) on every process of a pod."""
    from jax.experimental import multihost_utils

    data = json.dumps(payload).encode() if payload is not None else b""
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
    buffer = np.zeros(size, np.uint8)
    if data:
        buffer[:] = np.frombuffer(data, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(buffer), np.uint8)
    return json.loads(got.tobytes().decode())
