"""Batches computed in worker processes (config.data.workers): each spawned process holds its own
pipeline of the run's config, so prefetched batches use more cores than this process's GIL
allows, and are the same batches (a batch is a function of the config and the step). Each holds
an equal share of the host's block caches (config.data.store_cache_bytes, set by the pipeline that
starts them); closing that pipeline ends them."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import numpy as np

_PIPELINE = None  # this worker process's own pipeline


def _start(make_pipeline, config, workdir: str, process_index: int, process_count: int) -> None:
    global _PIPELINE
    config = config.copy_and_resolve_references()
    config.data.workers, config.data.prefetch = 0, 0
    _PIPELINE = make_pipeline(
        config, workdir, process_index=process_index, process_count=process_count
    )


def compute_batches(steps: list[int]) -> list[dict[str, np.ndarray]]:
    """The worker's batches of ``steps``, their rows read together (run in the worker)."""
    return _PIPELINE.compute_batches(steps)


def process_pool(make_pipeline, config, workdir: str, process_index: int, process_count: int):
    """config.data.workers spawned processes (fork is unsafe once JAX's threads exist), each
    opening the store and tokenizer of ``config`` itself with ``make_pipeline`` (the pipeline's
    module-level factory, passed in so this module does not import the pipeline)."""
    return concurrent.futures.ProcessPoolExecutor(
        config.data.workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start,
        initargs=(make_pipeline, config, workdir, process_index, process_count),
    )
