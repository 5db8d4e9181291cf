"""Bytes on the link per training step and per idle second, from the kernel's own counters.

    horovodrun -np 2 -hostfile hostfiles/edge python -m benchmarks.wire \
        --models mlp lenet5 --methods gradpart --label cycle=5ms --out wire.jsonl

Horovod's background thread coordinates the ranks once per cycle (``HOROVOD_CYCLE_TIME``), also
when no tensor is waiting, and negotiates every collective before it runs (with the response
cache, ``HOROVOD_CACHE_CAPACITY``, a repeated collective is agreed by a bit vector instead of a
list of requests). None of that is in the compressor's own byte count, yet all of it crosses the
link. Each launch of this module runs under one set of Horovod settings (they are read from the
environment at ``hvd.init()``): first both ranks sit idle for ``--idle-s`` seconds, then each
method trains each model on a fixed synthetic batch (per tensor and, with ``--num-groups``, in
groups), warm-up steps first, then ``--windows`` timing windows of ``--steps`` steps. Rank 0
reads its node's interface counters (tx and rx of every non-loopback interface,
``training.link_counters``) around the idle period and around the timed steps, and writes one
row per model, method and grouping: link bytes per step and per idle second, the compressor's
own count of bytes sent per step, the median step time, and the settings.
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import methods, training  # noqa: E402
from harness.models import DIGITS, MODELS, build_model  # noqa: E402

SETTINGS = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_FUSION_THRESHOLD")


def link_delta(before):
    """Bytes (tx, rx) on this node's link since the reading ``before``."""
    now = training.link_counters()
    return now["tx_bytes"] - before["tx_bytes"], now["rx_bytes"] - before["rx_bytes"]


def sent(compression):
    """The compressor's running totals ``(bytes, values)`` sent, zeros for Horovod's dense ones."""
    summary = training.compression_summary(compression)
    return (summary["total_sent_bytes"], summary["total_sent_elements"]) if summary else (0.0, 0.0)


def idle_rate(seconds):
    """Link bytes per second (tx, rx) while both ranks only sleep, after one collective."""
    hvd.allreduce(tf.ones([1]), name="wire_warmup").numpy()
    start, counters = time.perf_counter(), training.link_counters()
    time.sleep(seconds)
    tx, rx = link_delta(counters)
    elapsed = time.perf_counter() - start
    hvd.allreduce(tf.ones([1]), name="wire_idle_done").numpy()
    return tx / elapsed, rx / elapsed


def measure(model_name, spec, groups, batch, steps, args):
    """One row: link bytes and the compressor's count per timed step, and the median step time."""
    method, name, options = spec
    tf.keras.utils.set_random_seed(0)
    model = build_model(model_name, DIGITS, 10)  # one input shape for every model keeps rows comparable
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.0 if name == "dgc" else 0.9)
    compression = methods.build(name, options)
    step = training.make_step(model, optimizer, compression, num_groups=groups)
    for _ in range(args.warmup):
        step(*batch)[0].numpy()
    counted0, counters = sent(compression), training.link_counters()
    step_s, windows = training.time_steps(step, batch, steps, 0, args.windows)
    tx, rx = link_delta(counters)
    (bytes0, values0), (bytes1, values1) = counted0, sent(compression)
    total = steps * args.windows
    return {"model": model_name, "method": method, "compressor": name, "options": options,
            "num_groups": groups, "params": int(model.count_params()),
            "steps": total, "step_s": step_s, "windows_s": windows,
            "link_tx_per_step": tx / total, "link_rx_per_step": rx / total,
            "link_per_step": (tx + rx) / total,
            "counted_sent_per_step": (bytes1 - bytes0) / total,
            "counted_values_per_step": (values1 - values0) / total}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=["mlp", "lenet5"])
    p.add_argument("--methods", nargs="+", type=methods.registered, default=[("gradpart", "gradpart", {})],
                   help="NAME (registered) or NAME=COMPRESSOR[,KEY=VALUE...]")
    p.add_argument("--num-groups", nargs="+", type=int, default=[0],
                   help="make_step's num_groups, each measured in turn (0: one exchange per tensor)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--steps", type=int, default=50, help="steps per timing window")
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--dense-steps", type=int, default=5,
                   help="steps per window for --methods none (a dense step is slow on a shaped link)")
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--label", default="", help="free text stored with each row (e.g. the setting)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    training.limit_threads(1)
    hvd.init()
    idle_tx, idle_rx = idle_rate(args.idle_s)
    rs = np.random.RandomState(hvd.rank())
    batch = (tf.constant(rs.rand(args.batch_size, *DIGITS).astype(np.float32)),
             tf.constant(rs.randint(0, 10, args.batch_size).astype(np.int32)))
    settings = {k: os.environ.get(k, "default") for k in SETTINGS}
    for model_name in args.models:
        for spec, groups in [(m, g) for m in args.methods
                              for g in (args.num_groups if m[1] != "none" else [0])]:
            method = spec[0]
            steps = args.dense_steps if spec[1] == "none" else args.steps
            row = measure(model_name, spec, groups, batch, steps, args)
            if hvd.rank() != 0:
                continue
            row.update(label=args.label, settings=settings, ranks=hvd.size(), batch_per_rank=args.batch_size,
                       idle_tx_per_s=idle_tx, idle_rx_per_s=idle_rx, idle_per_s=idle_tx + idle_rx)
            print(f"{args.label} {model_name} {method} groups={groups}: "
                  f"{row['link_per_step'] / 1e3:.1f} kB/step on the link, "
                  f"{row['step_s'] * 1e3:.1f} ms/step, idle {row['idle_per_s'] / 1e3:.1f} kB/s", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
