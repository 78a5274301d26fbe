"""train.py whose stream batches are also written, one .npz a step and process, to
$BERTJAX_BATCHES (tests/stream_test.py compares them with an uninterrupted run's).

    BERTJAX_BATCHES=DIR python tests/stream_runner.py train.py [train.py's flags]
"""

import os
import runpy
import sys

import numpy as np

from bertjax.data.stream import source

compute = source.StreamPipeline.compute_batch


def compute_and_keep(self, step):
    batch = compute(self, step)
    path = os.path.join(os.environ["BERTJAX_BATCHES"], f"p{self.process_index}-{step}.npz")
    np.savez(path + ".tmp.npz", **batch)
    os.replace(path + ".tmp.npz", path)
    return batch


source.StreamPipeline.compute_batch = compute_and_keep
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
