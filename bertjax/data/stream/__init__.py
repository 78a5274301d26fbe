"""Pretraining batches read straight from a corpus's files, no store prepared
(config.data.stream): units.py (what a corpus is read in), lanes.py (which lane reads which unit,
and where a step's windows are), source.py (the data source)."""
