"""A long run that watches for leaks: resident memory, TF variables, traces.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python scripts/soak.py \
        --steps 5000 --out results/soak.json

Trains with the training loop of train.py (``training.make_step``, a
compressor through ``DistributedGradientTape``) for ``--steps`` steps,
cycling through epochs of the data; every ``--retrace-every`` steps the
batch is smaller, so the step function is retraced once and must then reuse
its trace and every residual. Every ``--every`` steps each rank samples its
resident memory (VmRSS), the number of live ``tf.Variable`` objects, the
compressor's residual slots and the step's trace count; rank 0 writes them
all, with the growth after ``--warmup`` steps, to ``--out`` (JSON).
"""
import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import training  # noqa: E402
from harness.data import DATASETS, batches, load_dataset, shard  # noqa: E402
from harness.models import MODELS, build_model  # noqa: E402
from hvd_gradpart import COMPRESSORS, get_compressor  # noqa: E402
from hvd_gradpart.metrics import resolve  # noqa: E402


def rss_mb():
    """This process's resident memory in MiB."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def live_variables():
    gc.collect()
    return sum(isinstance(o, tf.Variable) for o in gc.get_objects())


def stream(x, y, batch_size, seed, retrace_every):
    """Endless ``(step, x, y)``; every ``retrace_every``-th batch is cut to half size."""
    step, epoch = 0, 0
    while True:
        for xb, yb in batches(x, y, batch_size, seed, epoch):
            step += 1
            if retrace_every and step % retrace_every == 0:
                xb, yb = xb[:batch_size // 2], yb[:batch_size // 2]
            yield step, xb, yb
        epoch += 1


def growth(samples, key, warmup):
    """The largest rise of ``key`` on any rank since the first sample at or after ``warmup``."""
    after = [s[key] for s in samples if s["step"] >= warmup]
    return max(max(v[r] for v in after) - after[0][r] for r in range(len(after[0])))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--every", type=int, default=250, help="steps between samples")
    p.add_argument("--warmup", type=int, default=500, help="growth is measured from the first sample at or "
                                                           "after this step")
    p.add_argument("--retrace-every", type=int, default=100, help="a half-size batch every N steps (0: never)")
    p.add_argument("--model", choices=MODELS, default="lenet5")
    p.add_argument("--dataset", choices=DATASETS, default="mnist5k")
    p.add_argument("--compressor", choices=sorted(COMPRESSORS), default="gradpart")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", required=True, help="JSON result file (rank 0)")
    args = p.parse_args(argv)
    if not 0 < args.every <= args.warmup <= args.steps - args.every:
        p.error("need 0 < --every <= --warmup <= --steps - --every")
    return args


def main(argv=None):
    args = parse_args(argv)
    training.limit_threads(1)
    data = load_dataset(args.dataset, seed=0)
    compression = get_compressor(args.compressor)
    # Horovod: one process per node.
    hvd.init()
    if hvd.size() < 2:
        sys.exit("soak.py: error: run it under horovodrun with 2 or more ranks (one process skips compression)")
    rank = hvd.rank()
    x, y = shard(data.x_train, data.y_train, rank, hvd.size())
    model = build_model(args.model, data.x_train.shape[1:], data.num_classes, seed=0)
    optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
    step = training.make_step(model, optimizer, compression)
    instance = resolve(compression)
    samples, start = [], time.perf_counter()
    for i, xb, yb in stream(x, y, args.batch_size, 0, args.retrace_every):
        loss, _ = step(xb, yb)
        if i == 1:
            training.broadcast_initial_state(model, optimizer)
        if i % args.every == 0:
            # Horovod: every rank samples at the same step; rank 0 collects.
            mine = {"rss_mb": rss_mb(), "tf_variables": live_variables(),
                    "slots": len(instance.memory.slots) if instance else 0,
                    "traces": step.experimental_get_tracing_count()}
            every = hvd.allgather_object(mine)
            sample = {"step": i, "wall_s": time.perf_counter() - start, "loss": float(loss),
                      **{k: [r[k] for r in every] for k in mine}}
            samples.append(sample)
            if rank == 0:
                print(json.dumps(sample), flush=True)
        if i == args.steps:
            break
    if rank == 0:
        result = {"command": "horovodrun -np %d python scripts/soak.py %s" % (hvd.size(), " ".join(sys.argv[1:])),
                  "ranks": hvd.size(), "steps": args.steps, "warmup": args.warmup, "model": args.model,
                  "dataset": args.dataset, "compressor": args.compressor, "wall_s": time.perf_counter() - start,
                  **{f"{k}_growth": growth(samples, k, args.warmup)
                     for k in ("rss_mb", "tf_variables", "slots", "traces")},
                  "samples": samples}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"soak.py: {args.steps} steps in {result['wall_s']:.0f}s; after step {args.warmup}: "
              f"RSS +{result['rss_mb_growth']:.1f} MiB, TF variables +{result['tf_variables_growth']}, "
              f"traces +{result['traces_growth']}", flush=True)


if __name__ == "__main__":
    main()
