"""Reads ahead (bertjax/data/prefetch.py): whole groups up to ``ahead`` steps past the step asked
for, none at or past ``end`` (a phase's last step + 1), every batch the one computed in order."""

import concurrent.futures
import threading
import time

from bertjax.data.prefetch import Prefetch


def _prefetch(ahead, group, end=None):
    """A Prefetch over 2 threads whose batch of step s is ("batch", s); the reads it made."""
    reads, lock = [], threading.Lock()

    def compute(steps):
        with lock:
            reads.append(list(steps))
        return [("batch", s) for s in steps]

    executor = concurrent.futures.ThreadPoolExecutor(2)
    return Prefetch(compute, executor, ahead, group, end=end), reads


def test_reads_ahead_stop_at_the_end_and_a_later_step_is_computed_at_once():
    prefetch, reads = _prefetch(ahead=6, group=3, end=8)
    now = []
    for step in range(8):
        assert prefetch.batch(step, lambda s: now.append(s) or ("batch", s)) == ("batch", step)
    assert now == [0]  # the first batch comes first; the rest were read ahead
    assert reads == [[1, 2, 3], [4, 5, 6], [7]], reads  # whole groups, then the last before 8
    assert prefetch.batch(9, lambda s: now.append(s) or ("batch", s)) == ("batch", 9)
    assert now == [0, 9] and reads[-1] == [7]  # past the end: computed at once, nothing ahead
    prefetch.close()


def test_without_an_end_whole_groups_are_read_up_to_ahead_steps_past_the_step():
    prefetch, reads = _prefetch(ahead=6, group=3)
    for step in range(8):
        assert prefetch.batch(step, lambda s: ("batch", s)) == ("batch", step)
    assert reads[:3] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]], reads
    assert all(len(r) == 3 for r in reads) and max(map(max, reads)) <= 7 + 6
    prefetch.close()


def test_closing_leaves_behind_a_hung_read_the_step_waiting_for_it_took():
    """A read that hangs (storage that never answers) while the run's step waits for its batch,
    the phase's last: closing waits ``timeout_s`` for it, then leaves it behind instead of
    joining its thread (no other read is pending then: none is made past the end)."""
    answer = threading.Event()

    def compute(steps):
        if 2 in steps:
            answer.wait(10)  # the hung read (answers after 10 s)
        return [("batch", s) for s in steps]

    executor = concurrent.futures.ThreadPoolExecutor(1)
    prefetch = Prefetch(compute, executor, ahead=2, group=1, end=3)
    assert prefetch.batch(0, lambda s: ("batch", s)) == ("batch", 0)  # reads 1, 2 ahead
    assert prefetch.batch(1, lambda s: ("batch", s)) == ("batch", 1)
    waiting = threading.Thread(target=prefetch.batch, args=(2, None), daemon=True)
    waiting.start()  # the step waiting for step 2's read
    while 2 in prefetch._futures:  # (it took the read out of the reads ahead)
        time.sleep(0.01)
    start = time.monotonic()
    prefetch.close(timeout_s=0.5)
    closed_in = time.monotonic() - start
    answer.set()
    waiting.join(10)
    assert closed_in < 5, closed_in  # not joined until the read answered
