#!/usr/bin/env bash
# Horovod's own traffic on the link: one launch of benchmarks.wire per set of Horovod settings,
# on the two-node edge cluster at RATE, rows in results/wire.jsonl.
#   flock /tmp/hvd_gradpart_cluster.lock bash benchmarks/wire.sh
#   SETTINGS="default cycle=10ms:HOROVOD_CYCLE_TIME=10" bash benchmarks/wire.sh
# A setting is LABEL or LABEL:VAR=VALUE[,VAR=VALUE...]; "default" sets nothing. launch.py's own
# defaults are switched off here (HVD_GRADPART_LAUNCH_DEFAULTS=0) so that "default" is Horovod's.
# Environment: RATE (100mbit), MODELS (mlp lenet5), METHODS (gradpart), NUM_GROUPS (make_step's
# num_groups to measure, "0 1": per tensor and one group), ARGS (extra module arguments),
# DENSE_LABEL (the setting that also measures --methods none; default "default").
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
export HVD_GRADPART_LAUNCH_DEFAULTS=0
PY="$PWD/.venv/bin/python"
OUT=$(realpath -m "${OUT:-results}")
RATE=${RATE:-100mbit}
SETTINGS=${SETTINGS:-"default cycle=2ms:HOROVOD_CYCLE_TIME=2 cycle=5ms:HOROVOD_CYCLE_TIME=5
  cycle=10ms:HOROVOD_CYCLE_TIME=10 cycle=20ms:HOROVOD_CYCLE_TIME=20 no-cache:HOROVOD_CACHE_CAPACITY=0
  cycle=10ms,no-cache:HOROVOD_CYCLE_TIME=10,HOROVOD_CACHE_CAPACITY=0
  cycle=10ms,no-fusion:HOROVOD_CYCLE_TIME=10,HOROVOD_FUSION_THRESHOLD=0"}
rows="$OUT/wire.jsonl"
mkdir -p "$OUT"
[ "${APPEND:-0}" = 1 ] || rm -f "$rows"
bash scripts/edge_cluster.sh up --rate "$RATE" >/dev/null
trap 'bash scripts/edge_cluster.sh down >/dev/null' EXIT
for setting in $SETTINGS; do
  label=${setting%%:*}
  vars=()
  [[ $setting == *:* ]] && IFS=, read -r -a vars <<<"${setting#*:}"
  methods=${METHODS:-gradpart}
  [ "$label" = "${DENSE_LABEL:-default}" ] && methods="none $methods"
  log="$OUT/wire-$label.log"
  if ! env "${vars[@]}" "$PY" scripts/launch.py -np 2 -hostfile hostfiles/edge --gloo \
    "$PY" -m benchmarks.wire --models ${MODELS:-mlp lenet5} --methods $methods --num-groups ${NUM_GROUPS:-0 1} \
    --label "$RATE $label" --out "$rows" ${ARGS:-} > "$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "wire: the launch for $label failed (full log: $log)" >&2
    exit 1
  fi
  grep 'kB/step' "$log"
  rm -f "$log"
done
