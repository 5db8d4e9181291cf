"""Horovod's synthetic benchmark on the edge cluster's shaped link, one launch per compression.

    python -m benchmarks.synthetic --rate 20mbit \
        --out results/synthetic/mobilenetv2-20mbit.jsonl

Each compression (``--methods``: none, fp16, topk (1 %), powersgd, gradpart) is one launch of
``tests/parallel/synthetic_client.py`` (the shape of Horovod's TF2 synthetic benchmark: a
``tf.keras.applications`` model, one fixed batch, the compression built inside the traced step,
Horovod's per-tensor path as it ships, or ``--groups N``) through ``scripts/launch.py -np 2 -hostfile
hostfiles/edge`` with MPI (what ``horovodrun`` picks when Horovod has it; ``--gloo`` for Gloo),
under the cluster lock, on the two-node cluster shaped to ``--rate``. A row keeps the client's
images/s per rank (mean over its timed iterations), its first two steps (tracing and compiling)
and the launch's wall time, start-up included, as the user waits for it. Rows go to ``--out``
(JSON lines) and a Markdown table beside it.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tests" / "parallel"
METHODS = ("none", "fp16", "topk", "powersgd", "gradpart")


def launch(method, args):
    """One launch of the client; its RESULT row with the launch's wall time."""
    controller = "--gloo" if args.gloo else "--mpi"
    cmd = [sys.executable, str(ROOT / "scripts" / "launch.py"), "-np", "2", "-hostfile",
           str(ROOT / "hostfiles" / "edge"), controller, sys.executable, str(CLIENT / "synthetic_client.py"),
           "--compression", method, "--model", args.model, "--alpha", str(args.alpha),
           "--image-size", str(args.image_size), "--classes", str(args.classes), "--batch-size", str(args.batch_size),
           "--num-warmup-batches", str(args.warmup), "--num-batches-per-iter", str(args.batches),
           "--num-iters", str(args.iters), "--groups", str(args.groups)]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=CLIENT, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - start
    rows = [line.split("RESULT ", 1)[1] for line in done.stdout.splitlines() if "RESULT " in line]
    if done.returncode != 0 or not rows:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise SystemExit(f"synthetic: {method} failed (exit {done.returncode}):\n{tail}")
    row, _ = json.JSONDecoder().raw_decode(rows[0])  # a rank's later output may share the line
    return {**row, "method": method, "rate": args.rate, "controller": controller[2:],
            "batch_size": args.batch_size, "image_size": args.image_size,
            "classes": args.classes, "launch_wall_s": wall_s}


def table(rows):
    """Markdown: images/s and wall time per method, against none and PowerSGD where present."""
    by = {r["method"]: r for r in rows}
    ratio = lambda r, ref, key: f"{r[key] / by[ref][key]:.2f}x" if ref in by else ""
    lines = ["| method | img/s per rank | vs none | vs powersgd | first two steps s | launch wall s "
             "| wall vs powersgd | compression ratio |", "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['method']} | {r['img_sec_per_rank']:.1f} | {ratio(r, 'none', 'img_sec_per_rank')} "
                     f"| {ratio(r, 'powersgd', 'img_sec_per_rank')} | {r['first_two_steps_s']:.1f} "
                     f"| {r['launch_wall_s']:.0f} | {ratio(r, 'powersgd', 'launch_wall_s')} | {r['ratio']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="20mbit", help="the link, as scripts/edge_cluster.sh takes it")
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--model", default="MobileNetV2")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10, help="with --image-size 224, 1000: the stock model")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--warmup", type=int, default=5, help="warm-up batches after the two traced steps")
    p.add_argument("--batches", type=int, default=5, help="batches per timed iteration")
    p.add_argument("--iters", type=int, default=3, help="timed iterations")
    p.add_argument("--groups", type=int, default=0, help="Horovod's groups (0: per tensor, as Horovod ships)")
    p.add_argument("--gloo", action="store_true", help="Gloo instead of MPI")
    p.add_argument("--append", action="store_true", help="add to --out's rows instead of starting it anew")
    p.add_argument("--out", default=str(ROOT / "results" / "synthetic" / "mobilenetv2-20mbit.jsonl"))
    args = p.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if args.append and out.exists() else []
    cluster = Cluster(local=False)
    try:
        with open(out, "a" if args.append else "w") as f:
            for method in args.methods:
                with cluster.hold(args.rate):
                    rows.append(launch(method, args))
                f.write(json.dumps(rows[-1]) + "\n")
                f.flush()
                print(table(rows).splitlines()[-1], flush=True)
    finally:
        cluster.close()
    out.with_suffix(".md").write_text(table(rows))


if __name__ == "__main__":
    main()
