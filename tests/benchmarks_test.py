"""The GPU suite's dry mode runs the same benchmark code on CPU at tiny sizes, so it never rots."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_suite_dry_run_prints_the_table():
    env = dict(os.environ, BERTJAX_DRY_RUN="1", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    result = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_suite.sh")], env=env,
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| bertjax")]
    assert len(rows) == 6  # T=32 and 64: rbg dropout key, threefry, scan + remat
    for row in rows:
        tokens_per_second = float(row.split("|")[6].replace(",", ""))
        assert tokens_per_second > 0
