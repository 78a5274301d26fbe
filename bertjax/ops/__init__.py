"""The optional speed layer: hand-written backward passes and cheap random bits, each used where
it was measured faster (XLA:CPU today; docs/results/step.md). Each op computes what its plain
JAX reference computes (the tests compare them); the model and objectives call these, never the
other way round, and nothing here imports the rest of bertjax.

dense        `project` (Dense, Q/K/V, attention output) and `tied_decoder` (MLM decoder)
attention    softmax attention in independent row chains
blocked_attention  banded local and blocked (flash-style) global attention, no T x S array
splash       the TPU path: Pallas splash attention with segment ids and local masks
flash_dropout  the TPU path with attention dropout: Pallas kernels that regenerate the keep-bits
keep_bits    those bits: a counter-based hash of (seed, row, head, query position, key)
elementwise  exact GELU with a saved Phi(x), dropout masks from 16-bit halves of one hash
loss         cross-entropy whose backward is softmax minus one-hot in one pass
platform     `on_cpu()` and `current()`, the switches between these paths and autodiff's
"""
