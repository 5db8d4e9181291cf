"""A compressor built inside the traced step, as Horovod's synthetic benchmark builds its compression.

The step is traced at least twice (a Python ``first_batch`` flag, as in
Horovod's TF2 examples); every trace must get the instance the first one
built, so later traces find its residuals instead of creating variables.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart import GradPartCompressor, TopKCompressor

RANK, SIZE = init()
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                tf.keras.layers.Dense(10)])


def batch(step, size=16):
    rs = np.random.RandomState(100 * step + RANK)
    return rs.randn(size, 32).astype(np.float32), rs.randint(0, 10, size).astype(np.int32)


def train(built, groups=None, steps=4):
    """Trains with a step that builds ``GradPartCompressor()`` and ``TopKCompressor`` (two
    settings) inside; records every instance the traces built in ``built``."""
    model = make_model()
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y, first_batch):
        compression = GradPartCompressor()
        built.append((compression, TopKCompressor(ratio=0.1), TopKCompressor(ratio=0.2), TopKCompressor(ratio=0.1)))
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, groups=groups)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    for s in range(steps):
        step(*batch(s), s == 0)
    traces = step.experimental_get_tracing_count()
    check(traces >= 2 and len(built) == traces, f"{traces} traces built {len(built)} times")
    return model, step


def check_shared_across_traces():
    for groups in (None, 1):
        built = []
        model, _ = train(built, groups)
        first = built[0]
        check(all(a is b for later in built[1:] for a, b in zip(first, later)),
              f"groups={groups}: a retrace built new instances")
        gp, topk1, topk2, topk1_again = first
        check(topk1 is not topk2, "different settings share an instance")
        check(topk1 is not topk1_again, "two constructions in one trace share an instance")
        check(len(gp.memory.slots) == 1, f"groups={groups}: expected the one large kernel's slot, got "
                                         f"{sorted(gp.memory.slots)}")
        residual = next(iter(gp.memory.slots.values())).residual.numpy()
        # a dense last step flushed the residual into the gradient (the link budget's choice)
        flushed = any(b.read()["dense"] for b in gp.budgets.values())
        check(np.any(residual) or flushed, f"groups={groups}: residual never written")
        assert_same_on_all_ranks([v.numpy() for v in model.variables], f"groups={groups}: weights")
    other = []
    train(other)
    check(other[0][0] is not built[0][0], "two tf.functions share an instance")
    ok("a compressor built inside a tf.function traced twice keeps its residuals")


check_shared_across_traces()
ok(f"traced compressor checks passed on {SIZE} ranks")
