#!/usr/bin/env bash
# The main job: LeNet-5 on the embedded MNIST digits, GradPart against no compression,
# on two edge nodes joined by a 100 Mbit/s link (localhost when namespaces are not allowed).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
PY="$PWD/.venv/bin/python"
OUT=${OUT:-results/demo}
EPOCHS=${EPOCHS:-5}
RATE=${RATE:-100mbit}
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/linkprobe.json

started_cluster=0
status=0
bash scripts/edge_cluster.sh up --rate "$RATE" || status=$?
if [ "$status" = 0 ]; then
  started_cluster=1
  trap 'bash scripts/edge_cluster.sh down' EXIT
  hosts=(-hostfile hostfiles/edge)
  where="two edge nodes (edge-a, edge-b) over a $RATE link"
elif [ "$status" = 3 ]; then
  echo "demo: network namespaces are not available here; running both ranks on localhost instead" >&2
  hosts=(-H localhost:2)
  where="localhost (no shaped link)"
else
  echo "demo: the edge cluster could not be built (edge_cluster.sh exit $status, see above); stopping" >&2
  exit "$status"
fi

if [ "$started_cluster" = 1 ]; then
  .venv/bin/horovodrun -np 2 "${hosts[@]}" --mpi "$PY" "$PWD/scripts/linkprobe.py" \
    --out "$PWD/$OUT/linkprobe.json" 2>&1 | grep -o 'link 0<->.*' \
    || echo "demo: link probe failed (mpi4py over the cluster); continuing" >&2
fi
for method in none gradpart; do
  echo "demo: training lenet5 on mnist5k with --compressor $method on $where"
  "$PY" scripts/launch.py -np 2 "${hosts[@]}" --gloo --disable-cache \
    "$PY" "$PWD/scripts/train.py" --model lenet5 --dataset mnist5k --compressor "$method" \
    --epochs "$EPOCHS" --jsonl "$PWD/$OUT/$method.jsonl"
done
"$PY" scripts/summarize.py --title "LeNet-5 on mnist5k, 2 ranks, $where" \
  --plot "$OUT/demo.png" --markdown "$OUT/demo.md" --probe "$OUT/linkprobe.json" "$OUT"/none.jsonl "$OUT"/gradpart.jsonl
