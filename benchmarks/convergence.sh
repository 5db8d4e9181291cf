#!/usr/bin/env bash
# Trains one model with several compressor set-ups, same epochs and seed, on the edge cluster.
#   bash benchmarks/convergence.sh OUTDIR MODEL RUN...
# RUN is a method (harness/methods.py): NAME=COMPRESSOR[,KEY=VALUE...], e.g. none=none or
# no-fit=gradpart,fit=false.
# Writes OUTDIR/MODEL/NAME.jsonl (per epoch) and, for sparse compressors, NAME.tensors.jsonl
# (per-gradient metrics every TENSOR_EVERY steps). Environment: EPOCHS (3), SEED (0),
# RATE (100mbit), DATASET (mnist5k), BATCH (32), LR_SCHEDULE (constant). Brings the cluster up
# and leaves it down.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
PY="$PWD/.venv/bin/python"
out=$1 model=$2
shift 2
dir=$(realpath -m "$out/$model")
mkdir -p "$dir"
bash scripts/edge_cluster.sh up --rate "${RATE:-100mbit}" >/dev/null
trap 'bash scripts/edge_cluster.sh down >/dev/null' EXIT
for run in "$@"; do
  parsed=$("$PY" -m benchmarks.train_args "$run")  # the method's name, then train.py's arguments
  mapfile -t method <<<"$parsed"
  name=${method[0]}
  rm -f "$dir/$name.jsonl" "$dir/$name.tensors.jsonl"
  echo "bench: $model $name (${method[*]:1}), ${EPOCHS:-3} epochs at ${RATE:-100mbit}"
  .venv/bin/horovodrun -np 2 -hostfile hostfiles/edge --gloo --disable-cache \
    "$PY" "$PWD/scripts/train.py" --model "$model" --dataset "${DATASET:-mnist5k}" \
    "${method[@]:1}" --epochs "${EPOCHS:-3}" --seed "${SEED:-0}" \
    --batch-size "${BATCH:-32}" --lr-schedule "${LR_SCHEDULE:-constant}" --jsonl "$dir/$name.jsonl" \
    --tensor-jsonl "$dir/$name.tensors.jsonl" --tensor-every "${TENSOR_EVERY:-5}" 2>&1 \
    | grep --line-buffered -E 'epoch [0-9]|Error|error' || true
  [ -s "$dir/$name.jsonl" ] || echo "bench: $model $name wrote no records" >&2
done
