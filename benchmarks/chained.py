"""Which of Horovod's per-gradient conds TensorFlow chains, for one compressor (one process).

    python -m benchmarks.chained gradpart     # and: none, topk, ...

Without groups Horovod wraps each gradient's compress, allreduce and decompress in a ``tf.cond``
of its own. Traces ``hvd.DistributedGradientTape`` on a 3-layer MLP and prints each cond's
``If`` op with the other conds among its control inputs: a cond that waits for another one waits
for that gradient's collective too (docs/usage.md, "groups=1").
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvd_gradpart import get_compressor  # noqa: E402


def waits(name):
    """``{cond: [conds it waits for]}`` for every cond of a traced step with compressor ``name``."""
    hvd.init()
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(64),
                                 tf.keras.layers.Dense(10)])
    compression = get_compressor(name)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec((8, 64))).graph
    conds = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    names = {op.name for op in conds}
    return {f"{op.name} ({op.type})": [c.name for c in op.control_inputs if c.name in names] for op in conds}


def main(name):
    for cond, others in waits(name).items():
        print(f"{cond} waits for: {', '.join(others) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gradpart")
