"""train.py with faults a test injects (tests/faults_test.py): storage through ``faulty://``
(tests/faulty_fs.py, its plan from $BERTJAX_FAULTS; a plan by batch sees which batch each
request is for), and, with $BERTJAX_KILL_DURING_SAVE=STEP,
this process killed (SIGKILL) right after it starts the asynchronous save of the first step at
or after STEP, as a lost VM would leave it.

    python tests/fault_runner.py train.py [train.py's flags]
"""

import os
import runpy
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faulty_fs  # noqa: E402 (registers faulty://)

KILL_DURING_SAVE = os.environ.get("BERTJAX_KILL_DURING_SAVE")

if faulty_fs.PLAN.outage_from_batch or faulty_fs.PLAN.hang_from_batch:  # faults by batch
    from bertjax.data import pipeline

    compute = pipeline.Pipeline.compute_batches

    def compute_batches(self, steps):
        with faulty_fs.computing(steps):
            return compute(self, steps)

    pipeline.Pipeline.compute_batches = compute_batches

if KILL_DURING_SAVE:
    from bertjax.training import checkpoint

    save = checkpoint.Checkpointer.save

    def save_then_die(self, state, meta, *, force=False):
        started = save(self, state, meta, force=force)
        if started and int(state.step) >= int(KILL_DURING_SAVE):
            print(f"fault_runner: saving step {int(state.step)}, then SIGKILL", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # the async write has begun, not finished
        return started

    checkpoint.Checkpointer.save = save_then_die

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
