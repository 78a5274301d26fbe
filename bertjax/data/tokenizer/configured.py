"""The run's tokenizer, fixed once per run: a given SentencePiece model or Hugging Face vocabulary
(local or a URL), else a SentencePiece model trained on the training split and kept as
WORKDIR/tokenizer/spm.model. Process 0 trains it (into the workdir, or locally and uploads it when
the workdir is on cloud storage); every host then reads that one file, so all hosts tokenize
alike."""

from __future__ import annotations

import hashlib
import os

from bertjax import paths
from bertjax.data.text import corpus as corpus_lib
from bertjax.data.tokenizer.tokenizer import Tokenizer, train_sentencepiece

TOKENIZER_FILE = "spm.model"  # WORKDIR/tokenizer/spm.model when bertjax trains the tokenizer


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
        directory = os.path.join(workdir, "tokenizer")
        if process_count == 1:
            return train(directory)
        if process_index == 0:
            train(directory)
        _barrier("bertjax-tokenizer", process_count)
        kept = os.path.join(directory, TOKENIZER_FILE)
        if not os.path.isfile(kept):
            raise FileNotFoundError(
                f"{kept}: process 0 trained the tokenizer there, but process {process_index} "
                "cannot see it: the processes of a run need one workdir they all see (gs://, or "
                "a shared disk)"
            )
        return kept
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
        lambda: (s for _, doc in corpus_lib.split_documents(c, "train") for s in doc),
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
