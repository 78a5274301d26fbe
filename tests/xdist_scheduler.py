"""pytest-xdist's loadscope scheduling, mended so that a worker that crashes (a segfault, a test
that kills its own process, faulthandler_exit_on_timeout) fails the test it was running and the
run goes on to its end: with pytest-xdist 3.8.0 the run then hangs until CI's time limit.

Three faults of `xdist.scheduler.loadscope.LoadScopeScheduling` after a crash (pytest-xdist
issues 1323, 1327 and 1378, the fixes unreleased):

- ``remove_node`` puts every module the dead worker was given back on the queue, those it had
  finished too; a worker later handed such a module is sent no test, never reports one done and
  so is never given more work: at the end of the run every worker waits for ever.
- The crashed test goes back on the queue with its module and runs again on the replacement
  worker (it was already reported failed; a test that crashes every time takes each replacement
  down with it).
- A replacement worker is given one module; a worker runs a test only once it knows the next
  (or is told to stop), so a module of one test leaves it waiting for ever.

conftest.py installs it (``pytest_xdist_make_scheduler``) for ``--dist loadscope``; everything
else (the order of modules, ``--no-loadscope-reorder``) is xdist's own."""

from __future__ import annotations

from xdist.scheduler.loadscope import LoadScopeScheduling


class LoadScopeAfterCrashes(LoadScopeScheduling):
    def remove_node(self, node):
        """The test ``node`` was running when it crashed (None: it had none left); its modules'
        tests not run, but that one, go back on the queue."""
        workload = self.assigned_work.pop(node)
        unfinished = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
        if not unfinished:
            return None
        crashed = next(
            nodeid for unit in unfinished.values() for nodeid, done in unit.items() if not done
        )
        for unit in unfinished.values():
            unit.pop(crashed, None)  # reported failed by xdist; not run again
        self.workqueue.update({scope: unit for scope, unit in unfinished.items() if unit})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def _reschedule(self, node) -> None:
        # A worker waits for a second test before it runs its first: give a worker holding
        # fewer than two modules until it holds two tests or the queue is empty.
        if not node.shutting_down and node in self.registered_collections:
            while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)
        super()._reschedule(node)
