#!/usr/bin/env bash
# One prepared run on one GPU (about 8 minutes on an H100/H200), as is, from the repository root:
#  1. numerics: loss and gradients of bf16 cuDNN and XLA attention against float32 XLA at the
#     highest matmul precision, padded rows; then cuDNN's attention dropout against the exact
#     path's, loss over several draws (benchmarks/step/gpu_checks.py);
#  2. MFU of bertjax's train step, BERT-base at T=128 (B=256) and T=512 (B=64) and
#     ModernBERT-base at T=1024 (B=8), beside transformers' PyTorch models on the same GPU, with
#     the attention kernel each layer got and the roofline of the program that ran
#     (benchmarks/step/gpu_mfu.py; its table is appended to docs/results/step.md: bring that file
#     back). Rows run in that order until the time budget is spent; a failing row prints why.
#   bash benchmarks/step/gpu_suite.sh                  (on the GPU machine)
#   BERTJAX_DRY_RUN=1 bash benchmarks/step/gpu_suite.sh (tiny sizes on CPU: what the test runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${BERTJAX_DRY_RUN:-0}" = "1" ]; then
  python3 benchmarks/step/gpu_checks.py --impls xla --lengths 32 --batch 2 --layers 1 --hidden 32 \
    --heads 2 --intermediate 64 --vocab 256 --dropout-draws 2
  exec python3 benchmarks/step/gpu_mfu.py --dry-run --steps 1 --warmup 0 --no-record
fi
# JAX takes this share of the GPU up front; HF's PyTorch step runs in the rest, same process.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}
python3 -c "import jax, flax, optax; print(jax.devices(), jax.__version__, flax.__version__, optax.__version__)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv || true
SECONDS=0
timeout 150 python3 benchmarks/step/gpu_checks.py --impls cudnn,xla --lengths 128 \
  || echo "gpu_checks: failed or timed out (rc $?)"
echo "# gpu_checks took ${SECONDS} s"
timeout 420 python3 benchmarks/step/gpu_mfu.py --time-budget 330 \
  || echo "gpu_mfu: failed or timed out (rc $?)"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
