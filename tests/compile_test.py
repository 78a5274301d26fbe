"""`python -m bertjax.compile`'s parts: a smoke model's train step compiled for a 4-chip TPU
topology by the real TPU compiler (libtpu) on this CPU host, with splash attention inside
shard_map; the slice names; the collective count of an HLO loop."""

import pytest

from bertjax.aot import chips, hlo
from bertjax.training.run_config import load_config_file


def test_slice_names_give_cloud_tpu_grids():
    assert chips.parse_slice("v5p-128").topology_name == "v5p:4x4x4"  # 128 cores, 64 chips
    assert chips.parse_slice("v5e-256").topology_name == "v5e:16x16"
    assert chips.parse_slice("v6e-8").topology_name == "v6e:2x4"
    assert chips.parse_slice("v4-32").topology_name == "v4:2x2x4"
    assert chips.parse_slice("v5e:2x2").chips == 4
    with pytest.raises(ValueError, match="--topology='v3-8': not a TPU slice"):
        chips.parse_slice("v3-8")


LOOP_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%cond (p: (s32[], f32[64])) -> pred[] {
  %p = (s32[], f32[64]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p.1: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p.1 = (s32[], f32[64]) parameter(0)
  %x = f32[64] get-tuple-element(%p.1), index=1
  %ar = f32[64]{0} all-reduce(%x), channel_id=1, to_apply=%add
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  ROOT %t = (s32[], f32[64]) tuple(%i.1, %ar)
}

ENTRY %main () -> f32[] {
  %ag = bf16[8,128]{1,0} all-gather-start(%c), dimensions={0}
  %agd = bf16[8,128]{1,0} all-gather-done(%ag)
  %w = (s32[], f32[64]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[] constant(0)
}
"""


def test_collectives_count_loop_iterations_and_async_pairs_once():
    found = hlo.collectives(LOOP_HLO)
    assert (found["all-reduce"].count, found["all-reduce"].bytes) == (12, 12 * 64 * 4)
    assert (found["all-gather"].count, found["all-gather"].bytes) == (1, 8 * 128 * 2)


def test_smoke_train_step_compiles_for_a_tpu_topology_with_splash():
    pytest.importorskip("libtpu", reason="the TPU compiler (jax[tpu], Linux only)")
    from bertjax.aot.plan import compile_run

    config = load_config_file("configs/bert_tiny.py:smoke")
    report = compile_run(config, "v5e:2x2", eval_step=False)
    (train,) = report["programs"]
    assert report["devices"] == 4 and report["device_kind"].startswith("TPU v5")
    assert train["headroom"] > 0.9 and train["memory"]["total"] > 0
    # the encoder layer's attention is splash, a Mosaic kernel in the compiled program (forward
    # and backward), and it compiled on 4 chips only inside shard_map
    assert any(name.startswith("splash: global") for name in train["kernels"])
    assert train["mosaic_kernels"] >= 2
    assert train["collectives"]["all-reduce"]["count"] >= 1  # the data-parallel gradient sum
    assert 0 < train["roofline"]["mfu"] <= 1
