"""Stage 3, the token store: a corpus tokenized once. The local memmap store built in a cache
(memmap.py), and the sharded store on any URL (shard_format.py's layout, written by
shard_writer.py on one host or beam_prepare.py on Apache Beam, imported from MDS shards by
mds_import.py, read by range by shard_reader.py)."""
