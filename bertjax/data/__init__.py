"""bertjax.data: corpus -> tokenizer -> token store -> sample plans -> corruption -> `batch(step)`,
one folder a stage, the pipeline that runs them at the root.

text/           stage 1: sources (text files, the built-in CPython corpus, tfds, records, pairs,
                BEIR), sentence splitting, long-sentence cutting, the held-out split by document id
tokenizer/      stage 2: SentencePiece (trained here) or Hugging Face vocabularies, word starts
store/          stage 3: the corpus tokenized once: the local memmap store (memmap) and the
                sharded store on a URL (shard_format, written by shard_writer / beam_prepare or
                imported by mds_import, read by range by shard_reader through block_cache)
plans/          stage 4: sample plans (NSP, SOP, RoBERTa rows, token windows, packing) per store
                piece, the epochs of a split (epochs) in their order over pieces, windows and
                lanes (epoch_order), the stateless shuffle, the rows they make, the batch size
                and row length of every step
corruption/     stage 5: token / whole-word / n-gram / MacBERT / PERT / diffusion masking, keyed
                per row; MacBERT's similar words, PERT's permutation, causal-LM targets
data_config     config.data: defaults and checks by key
keys            keyed randomness (plans and corruption draw only from it)
source          DataSource, what the trainer may ask of any data source
pipeline        `make_pipeline(config, workdir).batch(step)`; batch_rows: rows located, read
                and built; prefetch: batches ahead, read several at a time; read_settings: how
                a store is read, chosen from what it is; mixture: several stores with sampling
                weights; workers: batches computed in worker processes
prepare         `python -m bertjax.data.prepare`: a sharded store on Apache Beam
"""

from bertjax.data.data_config import default_data_config
from bertjax.data.pipeline import Pipeline, make_pipeline
from bertjax.data.source import DataSource
from bertjax.data.tokenizer import Tokenizer

__all__ = ["DataSource", "Pipeline", "Tokenizer", "default_data_config", "make_pipeline"]
