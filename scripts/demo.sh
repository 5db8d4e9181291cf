#!/usr/bin/env bash
# The main job: wall-clock time to accuracy of GradPart (its defaults) against no compression,
# Top-k (1 %) and PowerSGD (the fastest peer of the time-to-accuracy matrix on this cell), on two
# edge nodes joined by a 100 Mbit/s link (localhost when namespaces are not allowed); then the
# adaptation leg: GradPart, Top-k and PowerSGD again while the link drops to DROP_RATE mid-run
# (benchmarks/linkdrop.py; DROP_RATE= skips it). A run is a method (harness/methods.py): NAME or
# NAME=COMPRESSOR[,KEY=VALUE...].
# Every launch's full output goes to a log under $OUT; the screen gets the demo's own lines,
# rank 0's line per evaluation as it comes (accuracy, the compressor's ratio and density since
# the last evaluation, training seconds), the summary tables and, when a step fails, the tail
# of its log.
#   MODEL=mlp EPOCHS=4 METHODS="none gradpart topk powersgd" RATE=100mbit \
#     DROP_RATE=10mbit DROP_METHODS="gradpart topk powersgd" OUT=results/demo bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
PY="$PWD/.venv/bin/python"
OUT=${OUT:-results/demo}
MODEL=${MODEL:-mlp}
EPOCHS=${EPOCHS:-4}
METHODS=${METHODS:-none gradpart topk powersgd}
RATE=${RATE:-100mbit}
DROP_RATE=${DROP_RATE-10mbit}
DROP_METHODS=${DROP_METHODS:-gradpart topk powersgd}
mkdir -p "$OUT"
out=$(cd "$OUT" && pwd)  # the ranks' working folder is not this one
rm -rf "$OUT"/*.jsonl "$OUT"/*.log "$OUT"/linkprobe.json "$OUT"/demo.png "$OUT"/demo.md "$OUT"/linkdrop
begin=$SECONDS

say() { echo "demo: $*"; }
progress() {  # NAME: the evaluation lines train.py prints on rank 0, as they come, under the method's name
  local line pattern='<stdout>: *(epoch [0-9.]+/[0-9]+ .*)$'
  while IFS= read -r line; do
    if [[ $line =~ $pattern ]]; then
      printf '  %-9s %s\n' "$1" "${BASH_REMATCH[1]}"
    fi
  done
}
failed() {  # LOG WHAT: the step's failure, its first error lines and the end of its log, then exit 1
  echo "demo: $2 failed; from $1:" >&2
  { grep -E 'Error|error:' "$1" | grep -vE 'RuntimeError|launch.py: error' | head -n 6
    echo "..."; tail -n 3 "$1"; } | sed 's/^/    /' >&2
  exit 1
}

# The cluster lock every user of the edge cluster takes (benchmarks/suite.sh, benchmarks.tta):
# a benchmark left running in the background finishes its launch before the demo takes the link.
exec {lock}>"${CLUSTER_LOCK:-/tmp/hvd_gradpart_cluster.lock}"
flock -n "$lock" || { say "waiting for the edge cluster (a benchmark holds ${CLUSTER_LOCK:-/tmp/hvd_gradpart_cluster.lock}) ..."; flock "$lock"; }

status=0
bash scripts/edge_cluster.sh up --rate "$RATE" >"$OUT/cluster.log" 2>&1 || status=$?
if [ "$status" = 0 ]; then
  trap 'bash scripts/edge_cluster.sh down >>"$OUT/cluster.log" 2>&1' EXIT
  hosts=(-hostfile hostfiles/edge)
  where="2 edge nodes over a $RATE link"
  say "edge cluster up: nodes edge-a and edge-b in their own network namespaces, linked at $RATE"
elif [ "$status" = 3 ]; then
  say "network namespaces are not available here ($(tail -n 1 "$OUT/cluster.log")); both ranks run on localhost, without a shaped link" >&2
  hosts=(-H localhost:2)
  where="2 ranks on localhost (no shaped link)"
else
  failed "$OUT/cluster.log" "building the edge cluster (scripts/edge_cluster.sh exit $status)"
fi

if [ "$status" = 0 ]; then
  .venv/bin/horovodrun -np 2 "${hosts[@]}" --mpi "$PY" "$PWD/scripts/linkprobe.py" \
    --out "$out/linkprobe.json" >"$OUT/linkprobe.log" 2>&1 \
    || say "the link probe failed (mpi4py over the cluster; see $OUT/linkprobe.log); going on without it"
fi
jsonls=()
for run in $METHODS; do
  parsed=$("$PY" -m benchmarks.train_args "$run")  # the method's name, then train.py's arguments
  mapfile -t method <<<"$parsed"
  name=${method[0]}
  log="$OUT/$name.log"
  say "training $MODEL on mnist5k, $EPOCHS epochs, ${method[*]:1} (output: $log) ..."
  started=$SECONDS
  "$PY" scripts/launch.py -np 2 "${hosts[@]}" --gloo --disable-cache \
    "$PY" "$PWD/scripts/train.py" --model "$MODEL" --dataset mnist5k "${method[@]:1}" \
    --epochs "$EPOCHS" --eval-every 0.25 --jsonl "$out/$name.jsonl" \
    --steps-jsonl "$out/$name.steps.jsonl" --log-every-steps 1 2>&1 | tee "$log" | progress "$name" \
    || failed "$log" "training $name (${method[*]:1})"
  say "  $name done in $((SECONDS - started)) s (launch, set-up and evaluations included)"
  jsonls+=("$OUT/$name.jsonl")
done
echo
"$PY" scripts/summarize.py --title "Time to accuracy: $MODEL on mnist5k, $where" \
  --plot "$OUT/demo.png" --markdown "$OUT/demo.md" --probe "$OUT/linkprobe.json" "${jsonls[@]}" \
  2>"$OUT/summarize.log" || failed "$OUT/summarize.log" "the summary"

if [ "$status" = 0 ] && [ -n "$DROP_RATE" ]; then
  echo
  flock -u "$lock"  # benchmarks.linkdrop takes the cluster lock itself, per launch
  say "adaptation: $DROP_METHODS, 250 steps each; after 150 the link drops from $RATE to $DROP_RATE (output: $OUT/linkdrop.log) ..."
  "$PY" -m benchmarks.linkdrop --model "$MODEL" --methods $DROP_METHODS --before "$RATE" --after "$DROP_RATE" \
    --drop-at 150 --steps 250 --results "$out/linkdrop" >"$OUT/linkdrop.log" 2>&1 \
    || failed "$OUT/linkdrop.log" "the adaptation leg"
  echo
  sed -n '3,$p' "$OUT/linkdrop/$MODEL-$RATE-$DROP_RATE/summary.md"
  echo
  echo "Step times (median of 20 steps) before the drop and 50 steps after it; densities are what"
  echo "GradPart's link budget chose on each side (the others send what they are set to)."
fi
echo
say "plot $OUT/demo.png, this summary $OUT/demo.md, full logs $OUT/*.log; $((SECONDS - begin)) s in all"
