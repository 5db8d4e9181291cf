"""Samples/s of every method side by side in one launch, with the compute-only bound.

    horovodrun -np 2 -hostfile hostfiles/edge python -m benchmarks.throughput \
        --model mlp --methods none gradpart --out results.jsonl

Each method trains the same model on a fixed synthetic batch: warm-up steps, then the median of
repeated timing windows. The compute-only bound is the same step without any communication.
``--num-groups`` goes to ``DistributedGradientTape`` (default 1: every gradient of a step in one
group, as ``scripts/train.py`` trains; 0: each gradient on its own).

A method is a registered name or ``NAME=COMPRESSOR[,KEY=VALUE...]`` (``harness/methods.py``, e.g.
``gradpart-fixed=gradpart,follow_link=false``). ``--matched-topk`` follows every sparse method
with exact Top-k at the density that method sent in its last step (``topk@NAME``): the two
selection rules' step times at the same density, side by side.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.matched import SELECTION_RULES, matched_topk  # noqa: E402
from harness import methods, training  # noqa: E402
from harness.models import MODELS, SHAPES, build_model  # noqa: E402
from hvd_gradpart import COMPRESSORS  # noqa: E402


def measure(model_name, spec, batch, args):
    method, name, options = spec
    tf.keras.utils.set_random_seed(0)
    model = build_model(model_name, SHAPES[model_name], 10)
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.0 if name == "dgc" else 0.9)
    compute_only = method == "compute-only"
    compression = None if compute_only else methods.build(name, options)
    step = training.make_step(model, optimizer, compression, communicate=not compute_only,
                              num_groups=args.num_groups)
    seconds, windows = training.time_steps(step, batch, args.steps, args.warmup, args.windows)
    return {"method": method, "compressor": name, "options": options, "model": model_name,
            "params": int(model.count_params()), "num_groups": args.num_groups,
            "step_s": seconds, "windows_s": windows,
            "samples_per_s": args.batch_size * hvd.size() / seconds,
            "compression": training.compression_summary(compression) if compression else None}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--methods", nargs="+", type=methods.registered,
                   default=[(m, m, {}) for m in sorted(COMPRESSORS)], help=f"NAME or {methods.GRAMMAR}")
    p.add_argument("--matched-topk", action="store_true",
                   help="after each sparse method, Top-k at the density it sent in its last step")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=5, help="steps per timing window")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--num-groups", type=int, default=1, help="Horovod groups per step; 0: per tensor")
    p.add_argument("--label", default="", help="free text stored with each row (e.g. the link rate)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    training.limit_threads(1)
    hvd.init()
    rs = np.random.RandomState(hvd.rank())
    batch = (tf.constant(rs.rand(args.batch_size, *SHAPES[args.model]).astype(np.float32)),
             tf.constant(rs.randint(0, 10, args.batch_size).astype(np.int32)))
    queue = [("compute-only", "compute-only", {}), *args.methods]
    while queue:
        row = measure(args.model, queue.pop(0), batch, args)
        if args.matched_topk and row["compressor"] in SELECTION_RULES:
            queue.insert(0, matched_topk(row["method"], row["compression"]["last_density"]))
        if hvd.rank() == 0:
            row.update(label=args.label, ranks=hvd.size(), batch_per_rank=args.batch_size)
            print(f"{args.label} {args.model} {row['method']}: {row['samples_per_s']:.0f} samples/s", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
