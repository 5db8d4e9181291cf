#!/usr/bin/env bash
# Measured scaling point: the same throughput benchmark on 2 and on 4 edge nodes, one cluster.
#   bash benchmarks/scaling.sh      # writes results/scaling.jsonl
# Environment: MODEL (mlp), RATE (100mbit), METHODS (none topk gradpart), STEPS (3), WINDOWS (3),
# WARMUP (6).
# Four ranks share this machine's cores, so the compute-only bound drops with the node count.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
PY="$PWD/.venv/bin/python"
OUT=${OUT:-results}
RATE=${RATE:-100mbit}
rows="$OUT/scaling.jsonl"
mkdir -p "$OUT"
rm -f "$rows"
bash scripts/edge_cluster.sh up --nodes 4 --rate "$RATE" >/dev/null
trap 'bash scripts/edge_cluster.sh down >/dev/null' EXIT
for hosts in edge edge4; do
  np=$(grep -c slots "hostfiles/$hosts")
  .venv/bin/horovodrun -np "$np" -hostfile "hostfiles/$hosts" --gloo --disable-cache \
    "$PY" -m benchmarks.throughput --model "${MODEL:-mlp}" \
    --methods ${METHODS:-none topk gradpart} --steps "${STEPS:-3}" --windows "${WINDOWS:-3}" \
    --warmup "${WARMUP:-6}" --label "$RATE" --out "$PWD/$rows" 2>&1 | grep -E 'samples/s|Error' || true
done
