"""Step time of the grouped exchange against Horovod's per-tensor path.

    horovodrun -np 2 -H localhost:2 python tests/parallel/grouped_timing.py [models] [steps] [windows]

For each model (default ``mlp,lenet5``; batch 64 per rank of synthetic data
shaped as MNIST, or as CIFAR-10 for ``resnet20``; one TF thread pair per
rank) and each of GradPart, Top-k and no compression, times
``training.make_step`` with ``num_groups`` 0 (per tensor) and 1 (one group),
and the compute-only step, in round-robin windows of ``steps`` steps (every
case sees the same machine load). Rank 0 prints one JSON line per case: the
median and the minimum ms per step over the windows. Set
``HOROVOD_TIMELINE`` to see the collectives each step runs.
"""
import json
import statistics
import sys

import numpy as np
import tensorflow as tf

from common import init
from hvd_gradpart import GradPartCompressor, TopKCompressor, training
from hvd_gradpart.models import build_model

RANK, SIZE = init()
MODELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mlp", "lenet5"]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
WINDOWS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
METHODS = {"gradpart": GradPartCompressor, "topk": lambda: TopKCompressor(ratio=0.01),
           "none": lambda: training.hvd.Compression.none}

rng = np.random.default_rng(RANK)
for name in MODELS:
    shape = (32, 32, 3) if name == "resnet20" else (28, 28, 1)
    batch = (tf.constant(rng.random((64, *shape), dtype=np.float32)),
             tf.constant(rng.integers(0, 10, 64).astype(np.int32)))
    steps = {}
    for label, method, groups in [("compute-only", None, 0)] + [(m, m, g) for m in METHODS for g in (0, 1)]:
        model = build_model(name, shape, 10)
        compression = METHODS[method]() if method else None
        steps[label, groups] = training.make_step(model, tf.keras.optimizers.SGD(0.01), compression,
                                                  communicate=method is not None, num_groups=groups)
        training.time_steps(steps[label, groups], batch, STEPS, warmup=5, windows=1)
    times = {case: [] for case in steps}
    for _ in range(WINDOWS):  # round-robin windows: every case sees the same machine load
        for case, step in steps.items():
            times[case].append(training.time_steps(step, batch, STEPS, warmup=0, windows=1)[0])
    for (label, groups), windows in times.items():
        if RANK == 0:
            print(json.dumps({"model": name, "method": label, "num_groups": groups,
                              "median_ms": round(1e3 * statistics.median(windows), 2),
                              "min_ms": round(1e3 * min(windows), 2)}), flush=True)
