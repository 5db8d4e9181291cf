#!/usr/bin/env bash
# The evaluation suite on the edge cluster, then its tables, plots and docs/results.md.
#   bash benchmarks/suite.sh              # quick (make bench): about 20 minutes on 2 cores
#   BENCH=full bash benchmarks/suite.sh   # full (make bench-full): every model, rate and stage
# Stages: throughput (benchmarks/throughput.sh), convergence of every registered method and the
# ablation of each GradPart stage (benchmarks/convergence.sh), GradPart's accuracy gap to no
# compression over 10 epochs and 5 seeds, in full mode also the 4-node run
# (benchmarks/scaling.sh). Quick mode trains the study's groups (none, variance) with topk and
# gradpart on lenet5, its gap on lenet5, and times the MLP at 100 Mbit/s; full mode covers every
# method, model and rate. Each stage holds the cluster lock (CLUSTER_LOCK) only while it runs,
# so other users of the cluster can go in between; each leaves the cluster down.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=${CLUSTER_LOCK:-/tmp/hvd_gradpart_cluster.lock}
OUT=benchmarks/results
METHODS=$(.venv/bin/python -c 'import hvd_gradpart as h; print(" ".join(sorted(h.COMPRESSORS)))')
QUICK_METHODS="none variance topk gradpart"
ABLATION=(no-fit=gradpart,fit=false no-partition=gradpart,partition=false
          no-entropy=gradpart,entropy=false no-predict=gradpart,predict=false)

locked() { flock "$LOCK" "$@"; }

throughput() {  # MODELS RATE...
  local models=$1 append=0 rate
  shift
  for rate in "$@"; do
    locked env APPEND=$append MODELS="$models" RATES="$rate" bash benchmarks/throughput.sh
    append=1
  done
}

convergence() {  # METHODS EPOCHS MODEL..., one hold per method
  local methods=$1 epochs=$2 model method
  shift 2
  rm -rf "${@/#/$OUT/convergence/}"
  for model in "$@"; do
    for method in $methods; do
      locked env EPOCHS="$epochs" bash benchmarks/convergence.sh "$OUT/convergence" "$model" "$method=$method"
    done
  done
}

ablation() {  # EPOCHS MODEL..., one hold per model; default GradPart is the convergence run
  local epochs=$1 model
  shift
  rm -rf "${@/#/$OUT/ablation/}"
  for model in "$@"; do
    locked env EPOCHS="$epochs" bash benchmarks/convergence.sh "$OUT/ablation" "$model" "${ABLATION[@]}"
    cp "$OUT/convergence/$model/gradpart.jsonl" "$OUT/ablation/$model/gradpart.jsonl"
  done
}

gap() {  # MODEL..., 10 epochs with a cosine learning rate, seeds 0-4; one hold per seed and model
  local seed model
  for seed in 0 1 2 3 4; do
    for model in "$@"; do
      rm -rf "$OUT/gap/seed$seed/$model"
      locked env SEED=$seed EPOCHS=10 RATE=10gbit LR_SCHEDULE=cosine \
        bash benchmarks/convergence.sh "$OUT/gap/seed$seed" "$model" none=none gradpart=gradpart
    done
  done
}

mode=${BENCH:-quick}
start=$(date +%s)
case $mode in
  quick)
    throughput mlp 100mbit
    convergence "$QUICK_METHODS" 3 lenet5
    ablation 3 lenet5
    gap lenet5 ;;
  full)
    throughput "mlp lenet5 resnet20" 10gbit 1gbit 100mbit 20mbit
    convergence "$METHODS" 5 mlp lenet5 resnet20
    ablation 5 mlp lenet5
    gap mlp lenet5 resnet20
    locked bash benchmarks/scaling.sh ;;
  *) echo "suite.sh: BENCH must be quick or full, got '$mode'" >&2; exit 2 ;;
esac
awk -v m="$mode" -v t="$(date -u +%FT%TZ)" -v s=$(($(date +%s) - start)) \
  'BEGIN { printf "{\"mode\": \"%s\", \"finished\": \"%s\", \"minutes\": %.1f}\n", m, t, s / 60 }' \
  > "$OUT/suite.json"
.venv/bin/python -m benchmarks.report --results "$OUT" --docs docs/results.md README.md
