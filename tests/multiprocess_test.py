"""Two processes x 2 CPU devices (jax.distributed on localhost) match one process with 4 devices."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import two_process_worker as worker
from helpers import child_env as _child_env
from helpers import free_port as _free_port

from bertjax.training import sharding

pytestmark = pytest.mark.slow  # end-to-end runs

WORKER = pathlib.Path(worker.__file__).resolve()
REPO = WORKER.parent.parent
TIMEOUT_S = 240


def _start_two_processes(out_path: pathlib.Path, workdir: str) -> list:
    port = _free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), str(i), "2", str(out_path), workdir],
            cwd=REPO,
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _wait(procs: list, out_path: pathlib.Path) -> tuple[bool, str]:
    logs, ok = [], True
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            logs.append(proc.communicate()[0])
            ok = False
        ok = ok and proc.returncode == 0
    return ok and out_path.exists(), "\n".join(log[-3000:] for log in logs)


def _one_process_losses() -> list:
    mesh = sharding.make_mesh(worker.step_config(data=-1).mesh, jax.devices()[:4])
    assert sharding.process_batch_rows(mesh, worker.BATCH) == slice(0, worker.BATCH)
    return worker.train_losses(mesh)


@pytest.fixture(scope="module")
def losses(tmp_path_factory, gcs_bucket):
    """(two-process result, one-process losses, the shared workdir); the reference runs while
    the workers do. Both workers also train into one gs:// workdir (the local GCS emulator).

    One retry with a fresh port covers a port taken between choosing and binding it.
    """
    log, reference = "", None
    for attempt in range(2):
        out_path = tmp_path_factory.mktemp(f"two_process_{attempt}") / "result.json"
        workdir = f"{gcs_bucket}/two_processes_{attempt}"
        procs = _start_two_processes(out_path, workdir)
        try:
            reference = reference or _one_process_losses()
        finally:
            ok, log = _wait(procs, out_path)
        if ok:
            return json.loads(out_path.read_text()), reference, workdir
    pytest.fail(f"two-process run failed twice; last logs:\n{log}")


def test_two_processes_match_one_process_with_four_devices(losses):
    result, reference, _ = losses
    assert result["devices"] == 4 and result["local_devices"] == 2
    assert result["rows"] == [0, worker.BATCH // 2]  # process 0 fed only its half
    # fp32, same global batch; only the collectives' (gloo vs in-process) reduction order differs.
    np.testing.assert_allclose(result["losses"], reference, rtol=1e-5)
    assert reference[0] != reference[1]  # two different batches were really trained on


def test_two_processes_share_one_url_workdir_and_one_writes_the_shared_files(losses):
    from bertjax import paths

    result, _, workdir = losses
    assert result["shared_workdir_step"] == 4
    metrics = paths.read_text(f"{workdir}/metrics.jsonl").splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [2, 4]  # one writer, not two
    assert paths.isfile(f"{workdir}/tokenizer/spm.model")  # process 0's, read by both
    assert paths.isfile(f"{workdir}/checkpoints/4/state/commit_success.txt")
    assert not {"gs:"} & set(os.listdir(REPO))
