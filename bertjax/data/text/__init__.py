"""Stage 1, text: where sentences come from (files, tfds, the built-in CPython corpus, records,
retrieval pairs, BEIR directories), split into sentences and into train/held-out documents."""
