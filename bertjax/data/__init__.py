"""bertjax.data: corpus → tokenizer → token store → sample plans → masking → `batch(step)`.

data_config     config.data: defaults and checks by key
text            sentence splitting, long-sentence cutting, the held-out split by document id
corpus          sources: text files, the built-in CPython corpus (builtin_corpus, stdlib_docs), tfds
tokenizer       SentencePiece (trained here) or Hugging Face vocabularies, with word starts
store           the corpus tokenized once into memory-mapped arrays (the local cache)
shard_format    the sharded store on a path or URL: shards + a manifest written last;
shard_writer,   its units of work, run on Apache Beam by `python -m bertjax.data.prepare`;
beam_prepare,   mds_import brings pre-tokenized MDS shards; shard_reader reads one host's
shard_reader    rows by byte ranges; mixture: several stores with sampling weights
samples, rows   sample plans (NSP, SOP, RoBERTa rows) and the rows they make, packing
masking         token (uniform or smoothed-unigram) / whole-word / n-gram / MacBERT / PERT /
                diffusion masking, keyed per row; similarity (MacBERT's similar words),
                permutation (PERT's shuffle and position targets)
keys, schedule  keyed randomness; the row length of every step
batch_plan      the global batch of every step (fixed, or growing by tokens: batch warmup)
source          DataSource, what the trainer may ask of any data source
pipeline        `make_pipeline(config, workdir).batch(step)`
"""

from bertjax.data.data_config import default_data_config
from bertjax.data.pipeline import Pipeline, make_pipeline
from bertjax.data.source import DataSource
from bertjax.data.tokenizer import Tokenizer

__all__ = ["DataSource", "Pipeline", "Tokenizer", "default_data_config", "make_pipeline"]
