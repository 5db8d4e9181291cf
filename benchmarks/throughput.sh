#!/usr/bin/env bash
# Throughput of every method side by side, per model and link rate, on the edge cluster.
#   bash benchmarks/throughput.sh       # quick: mlp and lenet5 at 100 and 20 Mbit/s
#   MODELS="mlp lenet5 resnet20" RATES="1gbit 100mbit 20mbit" bash benchmarks/throughput.sh
# NUM_GROUPS (default 1: every gradient of a step in one Horovod group; 0: per tensor).
# APPEND=1 adds rows to results/throughput.jsonl instead of starting it afresh (one
# call per rate, as make bench does, keeps each hold of the cluster short).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
PY="$PWD/.venv/bin/python"
OUT=${OUT:-results}
MODELS=${MODELS:-"mlp lenet5"}
RATES=${RATES:-"100mbit 20mbit"}
METHODS=${METHODS:-$("$PY" -c 'import hvd_gradpart as h; print(" ".join(sorted(h.COMPRESSORS)))')}
mkdir -p "$OUT"
rows="$OUT/throughput.jsonl"
[ "${APPEND:-0}" = 1 ] || rm -f "$rows"
bash scripts/edge_cluster.sh up >/dev/null
trap 'bash scripts/edge_cluster.sh down >/dev/null' EXIT
for rate in $RATES; do
  bash scripts/edge_cluster.sh rate "$rate" >/dev/null
  .venv/bin/horovodrun -np 2 -hostfile hostfiles/edge --mpi "$PY" "$PWD/scripts/linkprobe.py" \
    --out "$PWD/$OUT/linkprobe-$rate.json" >/dev/null 2>&1 || echo "bench: link probe failed at $rate" >&2
  for model in $MODELS; do
    log="$OUT/throughput-$model-$rate.log"
    if ! "$PY" scripts/launch.py -np 2 -hostfile hostfiles/edge --gloo --disable-cache \
      "$PY" -m benchmarks.throughput --model "$model" --methods $METHODS \
      --num-groups "${NUM_GROUPS:-1}" --label "$rate" --out "$PWD/$rows" > "$log" 2>&1; then
      tail -n 20 "$log" >&2
      echo "bench: the $model launch at $rate failed (full log: $log)" >&2
      exit 1
    fi
    grep 'samples/s' "$log"
  done
done
"$PY" -m benchmarks.report --table "$rows" > "$OUT/throughput.md"
cat "$OUT/throughput.md"
