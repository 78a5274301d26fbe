"""The launcher templates in launch/ restart bertjax by its exit table (bertjax/errors.py): for
every status a bertjax command exits with, each template's rule, read from the template and
applied as its launcher applies it, restarts exactly when the table says so. The SLURM script
runs for real (bash, with srun and scontrol stand-ins on PATH); xpk's, Kubernetes' and
systemd's rules are ports of what each documents, written out below."""

import os
import re
import shlex
import subprocess

import pytest
import yaml
from helpers import ROOT

from bertjax import errors

LAUNCH = os.path.join(ROOT, "launch")
EXITS = [status for status in errors.STATUSES if status != errors.FINISHED]  # failures


def _read(name: str) -> str:
    return open(os.path.join(LAUNCH, name)).read()


def _codes(spec: str) -> set[int]:
    """xpk's list syntax: "75,130-140"."""
    codes = set()
    for item in filter(None, (i.strip() for i in spec.split(","))):
        low, _, high = item.partition("-")
        codes.update(range(int(low), int(high or low) + 1))
    return codes


def test_xpk_restarts_by_the_table():
    """xpk restarts a workload on 42 and 127-255 by itself, plus --restart-on-exit-codes
    (xpk's workload create); bertjax never exits 42, 127 or 128."""
    words = shlex.split(_read("xpk.sh").split("xpk workload create", 1)[1].replace("\\\n", " "))
    flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    assert int(flags["max-restarts"]) > 0
    restarted = {42, *range(127, 256)} | _codes(flags["restart-on-exit-codes"])
    assert {s: s in restarted for s in EXITS} == {s: errors.restarts(s) for s in EXITS}
    assert int(flags["termination-grace-period-seconds"]) >= 30
    assert "--multihost" in flags["command"]


def _k8s_restarts(jobset: dict, status: int) -> bool:
    """Whether a JobSet restarts after a pod exits with ``status``: the Job's podFailurePolicy
    (first rule that matches: FailJob fails the Job with reason PodFailurePolicy, Ignore
    recreates the pod, Count or no match counts against backoffLimit), then the JobSet's
    failurePolicy (the first rule matching the Job's failure reason; none: RestartJobSet)."""
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    container = job["template"]["spec"]["containers"][0]["name"]
    reason = None
    for rule in job["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if not codes or codes.get("containerName", container) != container:
            continue
        inside = status in codes["values"]
        if inside == (codes["operator"] == "In"):
            if rule["action"] == "Ignore":
                return True
            reason = "PodFailurePolicy" if rule["action"] == "FailJob" else None
            break
    if reason is None:
        if job["backoffLimit"] > 0:
            return True  # the pod alone is recreated
        reason = "BackoffLimitExceeded"
    for rule in jobset["spec"]["failurePolicy"].get("rules", []):
        if reason in rule.get("onJobFailureReasons", [reason]):
            return rule["action"] != "FailJobSet"
    return jobset["spec"]["failurePolicy"]["maxRestarts"] > 0


def test_the_jobset_restarts_by_the_table():
    jobset = yaml.safe_load(_read("jobset.yaml"))
    assert {s: _k8s_restarts(jobset, s) for s in EXITS} == {s: errors.restarts(s) for s in EXITS}
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 30
    assert "--multihost" in pod["containers"][0]["command"]


def test_the_slurm_script_requeues_by_the_table_and_signals_every_rank(tmp_path):
    """The batch script runs under bash with an srun that exits with each status and an
    scontrol that records a requeue; --signal=TERM@300 has no "B:" (which would signal only
    the batch shell): SIGTERM reaches every task of every step."""
    script = _read("slurm.sbatch")
    options = re.findall(r"^#SBATCH (\S+)", script, re.MULTILINE)
    assert "--requeue" in options and "--signal=TERM@300" in options
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexit "$SRUN_STATUS"\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$SRUN_STATUS $@" >> "$REQUEUED"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    requeued = tmp_path / "requeued"
    # every status in one bash, the script's body as a function (cheaper than a bash a status)
    body = script.replace('exit "$status"', 'return "$status"')
    driver = (f"job() {{\n{body}\n}}\n"
              'for s in $STATUSES; do SRUN_STATUS=$s job; echo "$s $?"; done\n')  # fmt: skip
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", WORKDIR=str(tmp_path),
               SLURM_JOB_ID="1234", REQUEUED=str(requeued),
               STATUSES=" ".join(map(str, EXITS)))  # fmt: skip
    result = subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True)
    ended = dict(line.split() for line in result.stdout.splitlines() if line[:1].isdigit())
    assert ended == {str(s): str(s) for s in EXITS}, result.stderr[-2000:]  # passed through
    lines = requeued.read_text().splitlines() if requeued.exists() else []
    assert lines == [f"{s} requeue 1234" for s in EXITS if errors.restarts(s)]


def test_the_systemd_unit_restarts_by_the_table():
    """Restart=on-failure: systemd restarts after a non-zero exit status not listed in
    SuccessExitStatus, unless it is in RestartPreventExitStatus (RestartForceExitStatus:
    always)."""
    unit = dict(
        line.split("=", 1) for line in _read("bertjax.service").splitlines()
        if "=" in line and not line.startswith("#")
    )  # fmt: skip
    assert unit["Restart"] == "on-failure" and unit["KillSignal"] == "SIGTERM"
    prevent = {int(s) for s in unit.get("RestartPreventExitStatus", "").split()}
    success = {int(s) for s in unit.get("SuccessExitStatus", "").split()}
    force = {int(s) for s in unit.get("RestartForceExitStatus", "").split()}

    def restarts(status: int) -> bool:
        return status in force or (status not in success and status not in prevent)

    assert {s: restarts(s) for s in EXITS} == {s: errors.restarts(s) for s in EXITS}
    assert int(unit["TimeoutStopSec"]) >= 30


@pytest.mark.parametrize("name", ["xpk.sh", "jobset.yaml", "slurm.sbatch", "bertjax.service"])
def test_each_template_is_in_the_launcher_guide(name):
    assert f"launch/{name}" in open(os.path.join(ROOT, "docs", "launchers.md")).read()
