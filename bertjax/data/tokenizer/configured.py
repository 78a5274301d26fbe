"""The run's tokenizer, fixed once per run: a given SentencePiece model or Hugging Face vocabulary
(local or a URL), else a SentencePiece model trained on the training split and kept as
WORKDIR/tokenizer/spm.model. Process 0 trains it (into the workdir, or locally and uploads it when
the workdir is on cloud storage); every host then reads that one file, so all hosts tokenize
alike.

A tokenizer bertjax trains is also kept in the cache (CACHE/tokenizers/trained-KEY), keyed by what
it was trained on (the corpus's files with their versions and its held-out split, as the token
store's key; or the task's training text) and how (vocab_size, model type, language, seed,
SentencePiece's version): a run on the same text in another workdir copies it into its workdir
instead of training it again (minutes on a large corpus; the same model, so the token store built
with it is reused too)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import sentencepiece as spm

from bertjax import paths
from bertjax.data.text import corpus as corpus_lib
from bertjax.data.tokenizer.tokenizer import Tokenizer, train_sentencepiece

TOKENIZER_FILE = "spm.model"  # WORKDIR/tokenizer/spm.model when bertjax trains the tokenizer
TRAINER_VERSION = 1  # of tokenizer._train's settings: a change there makes cached models stale


def _barrier(name: str, process_count: int) -> None:
    if process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def workdir_tokenizer(
    sentences,
    workdir: str,
    cache: str,
    process_index: int,
    process_count: int,
    key=None,
    **options,
) -> str:
    """A SentencePiece model trained on ``sentences`` (an iterable, or a callable returning one;
    only consumed when training happens) and kept as WORKDIR/tokenizer/spm.model; a local path
    to it. ``options``: train_sentencepiece's (vocab_size, model_type, language, seed). ``key``:
    a callable returning what the sentences are made of (JSON), called only when the workdir has
    no model (a resume lists no corpus files), for the cache of trained tokenizers (None: no
    cache, the model is trained in the workdir)."""

    def cached() -> str | None:
        if key is None:
            return None
        parts = {**key(), **options, "sentencepiece": spm.__version__, "trainer": TRAINER_VERSION}
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
        return os.path.join(cache, "tokenizers", f"trained-{digest}")

    def train(directory: str) -> str:
        return train_sentencepiece(
            sentences() if callable(sentences) else sentences, directory, **options
        )

    def make(directory: str) -> str:
        """The model in ``directory``: trained there, or trained into the cache (unless it is
        there) and copied."""
        final = os.path.join(directory, TOKENIZER_FILE)
        if os.path.isfile(final) or key is None:
            return train(directory)
        _copy_directory(os.path.dirname(train(cached())), directory)
        return final

    if not paths.is_url(workdir):  # local (or shared) disk: kept in place
        directory = os.path.join(workdir, "tokenizer")
        if process_count == 1:
            return make(directory)
        if process_index == 0:
            make(directory)
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
        local = cached() or os.path.join(
            cache, "tokenizers", hashlib.sha256(kept.encode()).hexdigest()[:16]
        )
        paths.upload(train(local), kept)
    _barrier("bertjax-tokenizer", process_count)
    return paths.local_copy(kept, cache)


def _copy_directory(source: str, directory: str) -> None:
    """``source``'s files as ``directory`` (written beside it, on disk, renamed: whole or absent;
    where another process finished first, its copy is the same model)."""
    tmp = f"{directory.rstrip(os.sep)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    paths.publish_directory(tmp, directory)


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
        key=lambda: {"train_split_of": corpus_lib.config_parts(c)},
        vocab_size=c.vocab_size,
        model_type=c.tokenizer_type,
        language=c.language,
        seed=config.seed,
    )
    return Tokenizer(path, language=c.language)
