#!/usr/bin/env bash
# The evaluation suite on the edge cluster, then its tables, plots and docs/results.md.
#   bash benchmarks/suite.sh              # quick (make bench): about 7.5 hours on 2 cores
#   BENCH=full bash benchmarks/suite.sh   # full (make bench-full): every model, rate and stage
#   STAGES="tta" bash benchmarks/suite.sh # only the named stages of the mode
# Stages: tta, the time-to-accuracy matrix (python -m benchmarks.tta; quick: mlp and lenet5 at
# 100 and 20 Mbit/s, then, stage tta-conv, resnet20 and mobilenetv2 at 20 Mbit/s; full: every
# model at 10 Gbit/s, 100, 20 and 10 Mbit/s; 3 seeds, every
# registered method and the Top-k grid), throughput (benchmarks/throughput.sh), convergence of
# every registered method and the ablation of each GradPart stage (benchmarks/convergence.sh),
# GradPart's accuracy gap to no compression over 10 epochs and 5 seeds, in full mode also the
# 4-node run (benchmarks/scaling.sh). Quick mode trains the study's groups (none, variance) with
# topk and gradpart on lenet5, its gap on lenet5, and times the MLP at 100 Mbit/s; full mode
# covers every method, model and rate. Each stage holds the cluster lock (CLUSTER_LOCK) only
# while it runs (tta: while each of its runs does), so other users of the cluster can go in
# between; each leaves the cluster down. Resumable, and safe to leave running in the background
# (nohup make bench >bench.log 2>&1 &): a stage that fails does not stop the others, and a rerun
# of the same mode skips the stages an interrupted or failed run finished (and the tta runs
# already done); the suite exits 1 when a stage failed.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=${CLUSTER_LOCK:-/tmp/hvd_gradpart_cluster.lock}
OUT=results
METHODS=$(.venv/bin/python -c 'import hvd_gradpart as h; print(" ".join(sorted(h.COMPRESSORS)))')
QUICK_METHODS="none variance topk gradpart"
ABLATION=(no-fit=gradpart,fit=false no-partition=gradpart,partition=false
          no-entropy=gradpart,entropy=false no-predict=gradpart,predict=false)

STAMPS="$OUT/.suite-${BENCH:-quick}"  # the stages finished by an unfinished run of this mode
failed=""

locked() { flock "$LOCK" "$@"; }

stage() {  # NAME COMMAND...: unless STAGES leaves it out or an earlier unfinished run finished it
  local name=$1 rc
  shift
  case " ${STAGES:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  if [ -e "$STAMPS/$name" ]; then
    echo "suite: $name finished in an earlier, unfinished run of this mode; skipped"
    return 0
  fi
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    mkdir -p "$STAMPS" && touch "$STAMPS/$name"
  else
    echo "suite: stage $name failed (exit $rc); going on, a rerun retries it" >&2
    failed="$failed $name"
  fi
}

tta() {  # ARGS for benchmarks.tta, which takes the lock for each run itself and skips finished ones
  .venv/bin/python -m benchmarks.tta "$@"
}

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
    stage tta tta --models mlp lenet5 --links 100mbit 20mbit
    stage tta-conv tta --models resnet20 mobilenetv2 --links 20mbit
    stage throughput throughput mlp 100mbit
    stage convergence convergence "$QUICK_METHODS" 3 lenet5
    stage ablation ablation 3 lenet5
    stage gap gap lenet5 ;;
  full)
    stage tta tta
    stage throughput throughput "mlp lenet5 resnet20" 10gbit 1gbit 100mbit 20mbit
    stage convergence convergence "$METHODS" 5 mlp lenet5 resnet20
    stage ablation ablation 5 mlp lenet5
    stage gap gap mlp lenet5 resnet20
    stage scaling locked bash benchmarks/scaling.sh ;;
  *) echo "suite.sh: BENCH must be quick or full, got '$mode'" >&2; exit 2 ;;
esac
awk -v m="$mode" -v t="$(date -u +%FT%TZ)" -v s=$(($(date +%s) - start)) \
  'BEGIN { printf "{\"mode\": \"%s\", \"finished\": \"%s\", \"minutes\": %.1f}\n", m, t, s / 60 }' \
  > "$OUT/suite.json"
.venv/bin/python -m benchmarks.report --results "$OUT" --docs docs/results.md README.md
if [ -n "$failed" ]; then
  echo "suite: failed stages:$failed; rerun the same command to retry them (finished stages are skipped)" >&2
  exit 1
fi
rm -rf "$STAMPS"
