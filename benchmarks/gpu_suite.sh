#!/usr/bin/env bash
# One prepared accelerator run (about 8 minutes on one H100/H200-class GPU):
#  1. numerics: loss and gradients of bf16 cuDNN and XLA attention against float32 XLA at the
#     highest matmul precision, padded rows (benchmarks/gpu_checks.py);
#  2. BERT-base train step at T=128 (B=256) and T=512 (B=64, the same tokens per step) in bf16:
#     HF transformers' BertForPreTraining (bf16 autocast, SDPA, fused AdamW) beside bertjax with
#     cuDNN vs XLA attention, the dropout key's bit generator (rbg vs threefry), scan + full remat;
#     tokens/s, MFU (datasheet peak; the measured bf16 matmul peak is in the header), peak memory
#     (JAX's, over the process so far). Rows are started in that order until the time budget is
#     spent; a failing row prints its error and the rest go on.
# The table is appended to benchmarks/results.md (on the GPU machine: bring that file back).
# With BERTJAX_PROFILE_DIR set, each bertjax row also traces 3 steps there (read them with
# benchmarks/profile_summary.py).
#   bash benchmarks/gpu_suite.sh                  (on the GPU machine, from the repository root)
#   BERTJAX_DRY_RUN=1 bash benchmarks/gpu_suite.sh (tiny sizes on CPU: what the tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${BERTJAX_DRY_RUN:-0}" = "1" ]; then
  python3 benchmarks/gpu_checks.py --impls xla --lengths 32 --batch 2 --layers 1 --hidden 32 \
    --heads 2 --intermediate 64 --vocab 256
  exec python3 benchmarks/step_throughput.py --sizes tiny --lengths 32 --batch 4 \
    --dtype bfloat16 --attention-variants xla --prng rbg --no-hf --steps 1 --warmup 1 --no-record
fi
# JAX takes this share of the GPU up front; HF's PyTorch step runs in the rest, same process.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}
python3 -c "import jax, flax, optax; print(jax.devices(), jax.__version__, flax.__version__, optax.__version__)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv || true
SECONDS=0
timeout 150 python3 benchmarks/gpu_checks.py --impls cudnn,xla --lengths 128 \
  || echo "gpu_checks: failed or timed out (rc $?)"
echo "# gpu_checks took ${SECONDS} s"
timeout 400 python3 benchmarks/step_throughput.py --sizes base --lengths 128,512 --batch 256 \
  --dtype bfloat16 --attention-variants cudnn,xla --prng rbg --steps 10 --warmup 3 \
  --time-budget 320 ${BERTJAX_PROFILE_DIR:+--profile "$BERTJAX_PROFILE_DIR"} \
  || echo "step_throughput: failed or timed out (rc $?)"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
if [ -n "${BERTJAX_PROFILE_DIR:-}" ]; then  # one ROW.xplane.pb per row, no subfolders
  for trace in $(find "$BERTJAX_PROFILE_DIR" -mindepth 2 -name "*.xplane.pb"); do
    row=${trace#"$BERTJAX_PROFILE_DIR"/}
    mv "$trace" "$BERTJAX_PROFILE_DIR/${row%%/*}.xplane.pb"
  done
  find "$BERTJAX_PROFILE_DIR" -mindepth 1 -type d -exec rm -rf {} +
fi
