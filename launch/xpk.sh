#!/usr/bin/env bash
# bertjax on a Cloud TPU slice on GKE through xpk (how MaxText users launch): one JAX process a
# TPU VM, each `python train.py --multihost` (JAX finds the slice by itself).
#
# Restarts by bertjax's exit table (bertjax/errors.py, docs/launchers.md): xpk restarts the
# workload by itself on 42 and 127-255, which covers 128+N (stopped by a signal after saving:
# 143 a preemption); --restart-on-exit-codes adds 75 (storage unreachable, a lost host, a
# checkpoint set aside). Any other status (1 a bug, 2 bad input) fails the workload: the same
# command would fail the same way. tests/launchers_test.py checks this rule against the table.
#
#   CLUSTER=my-cluster BUCKET=my-bucket IMAGE=gcr.io/my-project/bertjax launch/xpk.sh
set -euo pipefail

: "${CLUSTER:?the GKE cluster xpk created}"
: "${BUCKET:?a bucket in the slice's region (checkpoints, metrics, compile cache)}"
: "${IMAGE:?a container image with bertjax installed (pip install bertjax[tpu])}"
WORKLOAD="${WORKLOAD:-bertjax-base}"
TPU_TYPE="${TPU_TYPE:-v5litepod-16}"
CONFIG="${CONFIG:-configs/bert_base.py}"

xpk workload create \
  --cluster="$CLUSTER" \
  --workload="$WORKLOAD" \
  --tpu-type="$TPU_TYPE" \
  --num-slices=1 \
  --docker-image="$IMAGE" \
  --max-restarts=100 \
  --restart-on-exit-codes=75 \
  --termination-grace-period-seconds=300 \
  --command="python train.py --multihost --config=$CONFIG --workdir=gs://$BUCKET/$WORKLOAD"
