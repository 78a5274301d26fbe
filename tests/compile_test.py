"""`python -m bertjax.compile`'s parts, checked on programs the real TPU compiler (libtpu)
compiled on this CPU host for small TPU topologies: the collectives a data-parallel step holds
(only the gradient reduction, equal to a hand count of the gradient bytes, packed rows and
scanned layers included), loop trips and async chains counted once each (a scanned FSDP step
against the same step unrolled), a two-slice step's DCN traffic, BERT-base's attention with
dropout by the flash_dropout kernel, phases that share a program, the report cache, and a program
too large reported as not fitting; plus the target names."""

import os
import sys
import types
from types import SimpleNamespace

import jax
import numpy as np
import pytest
import warm_python
from jax.sharding import PartitionSpec as P

from bertjax.aot import cache, chips, devices, hlo, plan
from bertjax.aot.collectives import collectives
from bertjax.compile import format_report
from bertjax.training import sharding
from bertjax.training.run_config import load_config_file
from bertjax.training.step import abstract_train_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _libtpu():
    pytest.importorskip("libtpu", reason="the TPU compiler (jax[tpu], Linux only)")


def _tiny(**model):
    """configs/bert_tiny.py:smoke (2 layers of width 32, vocab 400) compiled at XLA's default
    optimization, as a real run's step is (the smoke variant's -O0 changes the program)."""
    config = load_config_file(os.path.join(ROOT, "configs/bert_tiny.py:smoke"))
    config.fast_compile = False
    config.model.update(model)
    return config


def _gradient_bytes(config, report) -> tuple[int, int]:
    """(fp32 gradient bytes of every parameter, bytes of the tied word-embedding table)."""
    cfg = plan.model_config(config, plan._Ids(report["vocab_size"]))
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    state, _, _ = abstract_train_state(config, cfg, mesh)
    total = sum(int(np.prod(p.shape)) * 4 for p in jax.tree.leaves(state.params))
    return total, report["vocab_size"] * cfg.hidden_size * 4


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("compiled"))


@pytest.fixture(scope="module")
def data_parallel(cache_dir):
    """The train and eval steps on 4 chips, data parallel, packed rows; what the compiler left
    is cached."""
    _libtpu()
    config = _tiny()
    config.data.pack_rows = True
    return config, plan.compile_run(config, "v5e:2x2", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def fsdp_pair():
    """One FSDP step (3 layers, parameters over 4 chips) compiled scanned and unrolled."""
    _libtpu()
    reports = {}
    for scan in (True, False):
        config = _tiny(num_hidden_layers=3, scan_layers=scan)
        config.mesh.update(data=1, fsdp=4)
        reports[scan] = plan.compile_run(config, "v5e:2x2", eval_step=False)["programs"][0]
    return reports


def test_target_names():
    assert chips.parse_slice("v5p-128").topology_name == "v5p:4x4x4"  # 128 cores, 64 chips
    assert chips.parse_slice("v5e-256").topology_name == "v5e:16x16"
    assert chips.parse_slice("v6e-8").topology_name == "v6e:2x4"
    assert chips.parse_slice("v4-32").topology_name == "v4:2x2x4"
    assert chips.parse_slice("v5e:2x2").chips == 4
    two = chips.parse_slice("v5p-128", num_slices=2)
    assert (two.chips, two.devices, two.num_slices) == (64, 128, 2)
    assert chips.parse_slice("h100-8").grid == (1, 8)
    assert chips.parse_slice("h200-16").grid == (2, 8)
    assert chips.parse_slice("a100:2x8").devices == 16
    # Colab's runtimes: one-chip TPU hosts, v2-8 (4 chips of two TensorCores, each a device with
    # 8 GiB of its own), one GPU
    assert chips.parse_slice("v5e-1").topology_name == "v5e:1x1"
    assert chips.parse_slice("v6e-1").chip.hbm_per_device == 32 * chips.GIB
    v2 = chips.parse_slice("v2-8")
    assert (v2.topology_name, v2.chips, v2.devices) == ("v2:2x2", 4, 8)
    assert v2.chip.hbm_per_device == 8 * chips.GIB
    assert chips.parse_slice("a100-40g-1").chip.hbm_bytes == 40 * 10**9
    assert [chips.parse_slice(f"{g}-1").grid for g in ("t4", "l4")] == [(1, 1), (1, 1)]
    with pytest.raises(ValueError, match="--topology='v3-8': not a known target"):
        chips.parse_slice("v3-8")
    with pytest.raises(ValueError, match="12 GPUs is not whole 8-GPU nodes"):
        chips.parse_slice("h100-12")
    with pytest.raises(ValueError, match="--num_slices=2: slices are TPU slices"):
        chips.parse_slice("h100-8", num_slices=2)
    for name in ("v4-16", "v6e-8"):  # no published DCN rate: refused, not a roofline without it
        with pytest.raises(ValueError, match="--num_slices=2: v[46]e? has no published data"):
            chips.parse_slice(name, num_slices=2)


def test_gpu_nodes_are_described_from_the_chips_table():
    text = devices.gpu_target_config("h100")
    for field in ("core_count: 132", "device_memory_size: 80000000000", "major: 9 minor: 0"):
        assert field in text
    assert "memory_bandwidth: 3350000000000" in text  # the table's published figure
    assert 'device_description_str: "NVIDIA H200"' in devices.gpu_target_config("h200")
    try:  # the CUDA plugin is not part of the test install: its absence is one clear error
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        with pytest.raises(devices.CompilerMissing, match="pip install jax-cuda12-plugin"):
            devices.topology_devices(chips.parse_slice("h100-8"))


def _gpu_devices(chip: str) -> list:
    """One GPU of ``chip`` as the CUDA plugin describes it where installed; else a stand-in
    with the attributes the plugin's devices carry, from the table the plugin is given."""
    try:
        return devices.topology_devices(chips.parse_slice(f"{chip}-1"))
    except devices.CompilerMissing:
        info = devices.DEVICE_INFO[chip]
        capability = "{}.{}".format(*info["cc"])
        return [SimpleNamespace(platform="gpu", compute_capability=capability,
                                device_kind=info["name"])]  # fmt: skip


def test_the_dtype_follows_the_target():
    """bfloat16 on TPUs and on GPUs with bfloat16 arithmetic (compute capability >= 8.0), float32
    on a T4 (7.5): the TPU notebook's choice (`chips.compute_dtype`), and the line a bfloat16
    run on a T4 prints (`chips.dtype_advice`)."""
    t4 = _gpu_devices("t4")
    assert chips.compute_dtype(t4) == "float32" and not chips.parse_slice("t4-1").chip.bfloat16
    assert [chips.compute_dtype(_gpu_devices(g)) for g in ("l4", "a100-40g")] == ["bfloat16"] * 2
    assert chips.compute_dtype(t4 + _gpu_devices("l4")) == "float32"  # every device must
    advice = chips.dtype_advice("bfloat16", t4)
    assert advice.startswith("dtype: Tesla T4 has no bfloat16") and advice.endswith(
        "--config.model.dtype=float32"
    )
    assert chips.dtype_advice("float32", t4) == "" == chips.dtype_advice("bfloat16", _cpu())
    assert chips.compute_dtype(_cpu()) == "float32"
    _libtpu()
    for target in ("v5e-1", "v6e-1", "v2-8"):
        found = devices.topology_devices(chips.parse_slice(target))
        assert len(found) == chips.parse_slice(target).devices, target
        assert chips.compute_dtype(found) == "bfloat16", target


def _cpu():
    return jax.devices("cpu")[:1]


def test_the_tpu_notebook_sizes_its_run_for_the_colab_runtime():
    """The run colab/pretrain_tpu.ipynb builds from its own cells on a target's devices
    (benchmarks/compile/colab_fit.py compiles it; docs/results/compile.md: Colab runtimes):
    BERT-base at 32 rows a device, bfloat16 on a v5e-1, float32 on a T4, FSDP over 4 of v2-8's 8
    devices."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "compile"))
    import colab_fit

    _libtpu()
    v5e = colab_fit.notebook_config(devices.topology_devices(chips.parse_slice("v5e-1")))
    assert (v5e.model.hidden_size, v5e.model.num_hidden_layers) == (768, 12)
    assert (v5e.model.dtype, v5e.batch_size, v5e.data.max_seq_length) == ("bfloat16", 32, 128)
    assert colab_fit.notebook_config(_gpu_devices("t4")).model.dtype == "float32"
    v2 = colab_fit.notebook_config(devices.topology_devices(chips.parse_slice("v2-8")))
    assert (v2.batch_size, v2.mesh.fsdp) == (256, 4)


def test_data_parallel_step_reduces_the_gradients_and_nothing_else(data_parallel):
    config, report = data_parallel
    first, first_eval = report["programs"]
    assert (first["step"], first_eval["step"]) == ("train", "eval")
    assert report["devices"] == 4 and report["device_kind"].startswith("TPU v5")
    # data parallel: the only collective is the all-reduce of the gradients (and loss sums)
    assert set(first["collectives"]) == {"all-reduce"}
    reduced = first["collectives"]["all-reduce"]
    params, table = _gradient_bytes(config, report)
    # the hand count: every parameter's fp32 gradient once, plus the tied word-embedding table a
    # second time (GSPMD reduces the decoder's product and the lookup's scatter-add apart), plus
    # a few fp32 loss sums
    assert 0 <= reduced["bytes"] - (params + table) <= 64, (reduced["bytes"], params, table)
    assert reduced["group_sizes"] == {"4": reduced["count"]}
    assert reduced["wire_bytes"] == pytest.approx(2 * 3 / 4 * reduced["bytes"])  # ring, n=4
    # the encoder's attention is splash (Mosaic), inside shard_map: forward and backward
    assert any(name.startswith("splash: global") for name in first["kernels"])
    assert first["kernel_calls"]["mosaic"] >= 2 and first_eval["kernel_calls"]["mosaic"] >= 1
    assert plan.fits(first) and 0 < first["roofline"]["mfu"] <= 1
    assert first["roofline"]["basis"]["memory_s"].startswith("estimate")


def test_bert_base_trains_its_attention_with_the_dropout_kernel():
    """BERT-base's train step (its smoke size, first phase) on v5e: every layer's attention with
    dropout, the sparse last layer's gathered rows included, is the flash_dropout kernel (a
    Mosaic call forward and one backward each), and the report's kernel line names it."""
    _libtpu()
    config = load_config_file(os.path.join(ROOT, "configs/bert_base.py:smoke"))
    config.fast_compile = False
    config.phase_order = ("seq128",)
    assert config.model.attention_probs_dropout_prob > 0
    (train,) = plan.compile_run(config, "v5e:2x2", eval_step=False)["programs"]
    layers = config.model.num_hidden_layers
    assert train["kernels"] == {
        "flash_dropout: global, T=32, dropout": layers - 1,
        "flash_dropout: global, gathered rows, dropout": 1,
    }
    assert train["kernel_calls"]["mosaic"] == 2 * layers


def test_the_roofline_calls_only_bounds_bounds(data_parallel):
    """The ceiling is the largest bound (compute, ICI, DCN) and its MFU an upper bound ("MFU
    <="); the HBM estimate, where it is larger, gives "MFU ~" and never the word bound: on the
    compiled program's figures, and with its HBM bytes made to win."""
    _, report = data_parallel
    train = report["programs"][0]
    roof = train["roofline"]
    assert roof["bound"] in ("compute", "ICI", "DCN")
    assert roof["ceiling_s"] == max(roof["compute_s"], roof["ici_s"], roof["dcn_s"])
    assert roof["step_s"] == max(roof["ceiling_s"], roof["memory_s"]) and roof["mfu"] <= 1
    assert roof["mfu_ceiling"] == pytest.approx(roof["compute_s"] / roof["ceiling_s"])
    chip = chips.CHIPS["v5e"]
    args = (train["model_flops"], train["hbm_traffic"], train["ici_bytes"], 4, chip)
    heavy = plan.roofline.roofline(*args[:1], 1e6 * train["hbm_traffic"], *args[2:])
    assert heavy["limit"] == "HBM" and heavy["bound"] == roof["bound"]
    assert heavy["mfu_ceiling"] == roof["mfu_ceiling"] and heavy["mfu"] < roof["mfu_ceiling"]
    line = next(
        text
        for text in format_report({**report, "programs": [{**train, "roofline": heavy}]}).split(
            "\n"
        )
        if "roofline:" in text
    )
    assert f"({heavy['bound']}-bound), MFU <= {heavy['mfu_ceiling']:.0%}" in line
    assert "with the HBM estimate" in line and f"MFU ~ {heavy['mfu']:.0%}" in line
    assert "HBM-bound" not in line
    with pytest.raises(ValueError, match="v4: no published DCN rate"):
        plan.roofline.roofline(*args[:4], chips.CHIPS["v4"], dcn_bytes=1.0)


def test_phases_of_one_program_keep_their_own_flops(data_parallel, cache_dir):
    """Two phases whose programs differ only in constants (a mask rate: the same masked slots,
    more of them filled) compile once, and each reports its own FLOPs and roofline."""
    config, report = data_parallel
    config = config.copy_and_resolve_references()
    config.phase_order = ("high", "low")
    config.phases.high = plan.phases.phase(steps=2)
    config.phases.low = plan.phases.phase(steps=2, data={"mask_rate": 0.05})
    high, low = plan.compile_run(config, "v5e:2x2", eval_step=False, cache_dir=cache_dir)[
        "programs"
    ]
    assert low["same_as"] == "high" and "same_as" not in high
    assert high["model_flops"] > low["model_flops"]
    assert high["roofline"]["compute_s"] > low["roofline"]["compute_s"]
    assert high["collectives"] == low["collectives"]  # the same program
    assert "(this phase's)" in format_report({**report, "programs": [high, low]})


def test_a_reduce_scatter_counts_its_operand():
    """An 8-way psum_scatter of 32 KiB a chip, compiled by XLA (8 CPU devices): a plain
    ``reduce-scatter`` whose operand is 32 KiB and result 4 KiB; a ring sends 7/8 of the
    operand, 28,672 bytes (its result's 7/8 once: 3,584)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    scatter = jax.shard_map(
        lambda a: jax.lax.psum_scatter(a, "x", tiled=True),
        mesh=mesh,
        in_specs=PartitionSpec(),
        out_specs=PartitionSpec("x"),
    )
    operand = jax.ShapeDtypeStruct(
        (8192,), np.float32, sharding=NamedSharding(mesh, PartitionSpec())
    )
    text = jax.jit(scatter).lower(operand).compile().as_text()
    assert " reduce-scatter(" in text
    (found,) = collectives(text).values()
    assert (found.kind, found.bytes, found.operand_bytes) == ("reduce-scatter", 4096, 32768)
    assert found.wire_bytes == 28672


def test_the_cache_key_names_the_package_that_provides_the_compiler(monkeypatch):
    """libtpu's version as installed here, and a nightly or CUDA 13 package under its own name
    (the key once read only libtpu and jax-cuda12-plugin)."""
    import importlib.metadata

    _libtpu()
    assert cache.compiler_version("tpu").startswith(
        f"libtpu {importlib.metadata.version('libtpu')}, jax "
    )

    def installed(*names):
        return lambda: [types.SimpleNamespace(metadata={"Name": n}, version="9.9") for n in names]

    monkeypatch.setattr(importlib.metadata, "distributions", installed("libtpu-nightly", "numpy"))
    assert cache.compiler_version("tpu").startswith("libtpu-nightly 9.9, jax")
    monkeypatch.setattr(
        importlib.metadata, "distributions", installed("jax-cuda13-pjrt", "jax-cuda13-plugin")
    )
    assert cache.compiler_version("gpu").startswith("jax-cuda13-pjrt 9.9, jax-cuda13-plugin 9.9")


def test_phases_share_a_program_only_when_it_is_the_same(data_parallel):
    _libtpu()
    config = _tiny()
    config.phase_order = ("first", "lr", "loss")
    config.phases.first = plan.phases.phase(steps=2)
    config.phases.lr = plan.phases.phase(steps=2, optim={"learning_rate": 1e-4})
    config.phases.loss = plan.phases.phase(steps=2, loss={"sparse_last_layer": False})
    devices = plan.devices_lib.topology_devices(chips.parse_slice("v5e:2x2"))
    keys = [plan.program_key(p.text) for p in plan.lower_run(config, devices, 400, False)]
    # a new learning rate only changes constants; a loss without the sparse last layer is
    # another program (a key on the config's fields once called it the same)
    assert keys[0] == keys[1] != keys[2]


def test_a_second_check_reads_the_compiled_programs_back(data_parallel, cache_dir):
    config, report = data_parallel
    config = config.copy_and_resolve_references()
    config.optim.learning_rate *= 2  # only a constant: the same programs, read back
    again = plan.compile_run(config, "v5e:2x2", cache_dir=cache_dir)
    for first, second in zip(report["programs"], again["programs"]):
        assert second["cached"] and "cached" not in first
        assert {k: v for k, v in second.items() if k != "cached"} == first
    train = report["programs"][0]  # the fit's one probe: the config as it is, which fits
    assert train["fit"]["microbatches"] == 1 and not train["fit"]["changed"]
    assert [t[:3] for t in train["fit"]["tried"]] == [[1, "none", 1]]


def test_quick_check_extrapolates_to_a_hand_count(data_parallel, cache_dir, tmp_path):
    """12 layers from 2 and 3 (the 2-layer program read back from the data-parallel test's): the
    only collective, the gradient reduction, and the FLOPs equal a hand count of the 12-layer
    model; the HLO it writes is the two small depths', and the report says so."""
    _libtpu()
    config = _tiny(num_hidden_layers=12)
    config.data.pack_rows = True
    hlo_dir = str(tmp_path / "hlo")
    report = plan.compile_run(
        config, "v5e:2x2", eval_step=False, cache_dir=cache_dir, quick=True, hlo_dir=hlo_dir
    )
    assert report["hlo_files"] == [
        os.path.join(hlo_dir, f"{d}_layers", "run.train.hlo.txt") for d in (2, 3)
    ]
    assert all(os.path.getsize(path) for path in report["hlo_files"])
    assert "not the recipe's depth" in format_report(report)
    (train,) = report["programs"]
    assert train["extrapolated"] == {"from_layers": [2, 3], "layers": 12}
    params, table = _gradient_bytes(config, report)
    assert set(train["collectives"]) == {"all-reduce"}
    reduced = train["collectives"]["all-reduce"]["bytes"]
    assert 0 <= reduced - (params + table) <= 64
    cfg = plan.model_config(config, plan._Ids(400))
    assert train["model_flops"] == pytest.approx(
        plan._train_flops(config, plan.objectives.make_objective(config), cfg, 8)
    )


def test_cramming_microbatches_reduce_each_gradient_once():
    """configs/cramming.py (its smoke size) with 2 microbatches on 4 chips, data parallel: each
    chip keeps its partial sums through the microbatch loop and the step reduces every fp32
    gradient once, the word table included (it crossed twice a microbatch, as the lookup's
    scatter-add and the tied decoder's product: 301,068 bytes here before), plus the loss
    sums."""
    _libtpu()
    config = load_config_file(os.path.join(ROOT, "configs/cramming.py:smoke"))
    config.fast_compile = False
    config.optim.grad_accum_steps = 2
    config.fit = "off"  # 2 microbatches, though 1 fits
    report = plan.compile_run(config, "v5e:2x2", eval_step=False)
    (train,) = report["programs"]
    assert train["microbatches"] == 2 and train["mesh"]["data"] == 4
    assert set(train["collectives"]) == {"all-reduce"}
    reduced = train["collectives"]["all-reduce"]
    params, _ = _gradient_bytes(config, report)
    assert 0 <= reduced["bytes"] - params <= 64, (reduced["bytes"], params)
    assert reduced["count"] <= 2  # the gradients and the loss sums, after the loop


def test_scanned_and_unrolled_fsdp_steps_count_the_same_collectives(fsdp_pair):
    scanned, unrolled = fsdp_pair[True], fsdp_pair[False]
    for kind in ("all-gather", "reduce-scatter", "all-reduce"):
        got, want = scanned["collectives"][kind], unrolled["collectives"][kind]
        # per step, each loop trip counted and each async chain once: the same bytes moved
        assert got["bytes"] == pytest.approx(want["bytes"], rel=0.01), kind
        assert got["operand_bytes"] == pytest.approx(want["operand_bytes"], rel=0.01), kind
    # FSDP gathers each layer's weights in the forward and again in the backward pass: at
    # least 2 x 3 layers x 8192 weights of 2 bytes; reduce-scatters keep a quarter per chip
    assert scanned["collectives"]["all-gather"]["bytes"] >= 2 * 3 * 8192 * 2
    rs = scanned["collectives"]["reduce-scatter"]
    assert rs["bytes"] * 4 == rs["operand_bytes"]
    assert scanned["scan_layers"] and not unrolled["scan_layers"]


def test_the_hbm_estimate_counts_a_scanned_layer_s_slice_not_the_whole_stack():
    """A scan that stacks each step's output (as a scanned layer stack keeps its residuals):
    libtpu writes each slice in place inside a fusion with two outputs; the estimate counts the
    slice written per trip, not the whole stacked array (8x here, read and written)."""
    _libtpu()
    layers, rows, width = 8, 4096, 1024
    chip = devices.topology_devices(chips.parse_slice("v5e:2x2"))[:1]
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(chip), ("x",)), P())

    def stack(x, w):
        def layer(h, w_layer):
            y = jax.numpy.tanh(h @ w_layer)
            return y, y * 2

        return jax.lax.scan(layer, x, w)

    shapes = [(rows, width), (layers, width, width)]
    args = [jax.ShapeDtypeStruct(s, jax.numpy.bfloat16, sharding=replicated) for s in shapes]
    text = jax.jit(stack).lower(*args).compile().as_text()
    assert "dynamic-update-slice_fusion" in text
    stacked = layers * rows * width * 2  # the outputs' bytes: each slice written once
    assert stacked <= hlo.hbm_traffic(text) <= 4 * stacked


def test_loop_trips_read_from_a_tpu_layout_and_a_peeled_start():
    text = """HloModule m, num_partitions=4

%cond (p: (s32[], f32[64])) -> pred[] {
  %p = (s32[]{:T(128)}, f32[64]{0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %n = s32[]{:T(128)} constant(12)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%body (p.1: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p.1 = (s32[]{:T(128)}, f32[64]{0}) parameter(0)
  %x = f32[64]{0} get-tuple-element(%p.1), index=1
  %ar = f32[64]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %i.1 = s32[]{:T(128)} get-tuple-element(%p.1), index=0
  %two = s32[]{:T(128)} constant(2)
  %next = s32[]{:T(128)} add(%i.1, %two)
  ROOT %t = (s32[]{:T(128)}, f32[64]{0}) tuple(%next, %ar)
}

ENTRY %main () -> f32[] {
  %start = s32[]{:T(128)} constant(2)
  %v = f32[64]{0} constant({...})
  %init = (s32[]{:T(128)}, f32[64]{0}) tuple(%start, %v)
  %w = (s32[]{:T(128)}, f32[64]{0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[] constant(0)
}
"""
    module = hlo.Module(text)
    assert module.runs["body"] == 5  # i = 2, 4, ..., 10: (12 - 2) / 2
    (reduce,) = collectives(module).values()
    assert (reduce.count, reduce.bytes, reduce.group_sizes) == (5, 5 * 256, {2: 5})


def test_two_slices_reduce_across_the_data_center_network():
    _libtpu()
    config = _tiny(scan_layers=True)
    report = plan.compile_run(config, "v5e:2x2", eval_step=False, num_slices=2)
    (train,) = report["programs"]
    assert report["devices"] == 8 and train["mesh"]["dcn"] == 2 and train["mesh"]["data"] == 4
    found = train["collectives"]
    # libtpu compiles one program per slice: the gradients are reduced within the slice
    # (reduce-scatter / all-reduce over its 4 chips), all-reduced between the slices (host
    # transfers over the data-center network), and gathered back within the slice
    assert set(found) <= {
        "reduce-scatter", "all-reduce", "all-gather", "collective-permute", "all-reduce (dcn)"
    }  # fmt: skip
    params, table = _gradient_bytes(config, report)
    in_slice = found["all-reduce"]["bytes"] + found["reduce-scatter"]["operand_bytes"]
    assert in_slice == pytest.approx(params + table, rel=0.05)
    between = found["all-reduce (dcn)"]
    assert between["group_sizes"] == {"2": between["count"]}
    assert (params + table) / 4 <= between["bytes"] <= 1.05 * (params + table)
    assert train["dcn_bytes"] == pytest.approx(between["bytes"])  # 2 (s - 1) / s, s = 2
    assert train["roofline"]["dcn_s"] > 0


def test_a_program_too_large_is_reported_as_not_fitting():
    _libtpu()
    command = [
        sys.executable, "-m", "bertjax.compile", "--config=configs/bert_tiny.py:smoke",
        "--topology=v5e:2x2", "--skip_eval", "--cache_dir=", "--config.batch_size=262144",
        "--config.data.max_seq_length=64", "--config.model.max_position_embeddings=64",
        "--config.fit=off",  # as configured (the fit would choose microbatches)
    ]  # fmt: skip
    result = warm_python.run(command, cwd=ROOT, env=os.environ, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "DOES NOT FIT" in result.stdout and "--config.optim.grad_accum_steps" in result.stdout
    assert "Traceback" not in result.stderr


def test_quick_check_of_a_depth_the_compiler_refused():
    """--quick where the deeper of the two small programs did not fit: the real depth is
    reported as not fitting, its need extrapolated from both depths (memory grows with layers)."""
    from bertjax.aot import extrapolate

    gib = 2**30

    def report(total, refused=False):
        program = {"memory": {"total": total}, "hbm_per_device": 16 * gib, "compile_s": 5.0}
        if refused:
            program["out_of_memory"] = "RESOURCE_EXHAUSTED: ..."
        else:
            program.update(model_flops=1.0, hbm_traffic=1.0, ici_bytes=0, dcn_bytes=0)
        return {"chip": {"name": "v5e"}, "devices": 4, "programs": [program]}

    out = extrapolate.extrapolate(report(10 * gib), report(18 * gib, True), 2, 3, 12)
    (program,) = out["programs"]
    assert "out_of_memory" in program and program["extrapolated"]["layers"] == 12
    assert program["memory"]["total"] == 10 * gib + 10 * 8 * gib  # 2 layers + 10 x (3 - 2)
    assert program["headroom"] == pytest.approx(1 - 90 / 16)
    assert program["compile_s"] == 10.0
