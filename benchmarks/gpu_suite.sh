#!/usr/bin/env bash
# One prepared accelerator run (<= 8 minutes on one H100/H200-class GPU): BERT-base train step
# at T=128 and 512 in bf16, batch sized to fill the chip, cuDNN vs XLA attention, remat on/off,
# printing tokens/s, MFU and peak memory; the table is appended to benchmarks/results.md.
#   bash benchmarks/gpu_suite.sh                  (on the GPU machine, from the repository root)
#   BERTJAX_DRY_RUN=1 bash benchmarks/gpu_suite.sh (tiny sizes on CPU: what the tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${BERTJAX_DRY_RUN:-0}" = "1" ]; then
  exec python3 benchmarks/step_throughput.py --sizes tiny --lengths 32,64 --batch 4 \
    --dtype bfloat16 --attention-variants xla --no-hf --steps 1 --warmup 1 --no-record
fi
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
python3 -c "import jax; print(jax.devices())"
# 256 x 128 tokens per step at T=128; the same tokens per step (64 x 512) at T=512.
timeout 420 python3 benchmarks/step_throughput.py --sizes base --lengths 128,512 --batch 256 \
  --dtype bfloat16 --attention-variants cudnn,xla --no-hf --steps 10 --warmup 3
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
