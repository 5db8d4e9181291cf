"""Every registered method trains under DistributedGradientTape in tf.function.

For each entry of ``COMPRESSORS``, passed as Horovod users pass it (the class,
so sparse methods run with their defaults), plus the variance method in its
faithful mode (per-example variances observed inside the step): ranks end
bit-identical and the loss on a fixed evaluation set goes down.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart.compressors import COMPRESSORS, BaseCompressor, VarianceCompressor
from hvd_gradpart.metrics import summary

RANK, SIZE = init()
STEPS = 8
TEACHER = np.random.RandomState(42).randn(32, 10).astype(np.float32)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def batch(seed, size=16):
    x = np.random.RandomState(seed).randn(size, 32).astype(np.float32)
    return x, np.argmax(x @ TEACHER, 1).astype(np.int32)


def make_model():
    tf.keras.utils.set_random_seed(5)
    return tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="tanh"),
                                tf.keras.layers.Dense(10)])


def train(compression, microbatches=0):
    """Trains STEPS steps; returns (weights, loss before, loss after)."""
    model = make_model()
    opt = tf.keras.optimizers.SGD(0.5)
    x_eval, y_eval = batch(10_000, 256)
    evaluate = lambda: float(LOSS(y_eval, model(x_eval)))

    @tf.function
    def step(x, y):
        if microbatches:
            grads = []
            for xm, ym in zip(tf.split(x, microbatches), tf.split(y, microbatches)):
                with tf.GradientTape() as tape:
                    micro = LOSS(ym, model(xm, training=True))
                grads.append(tape.gradient(micro, model.trainable_variables))
            compression.observe_microbatches(grads)
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    before = evaluate()
    for s in range(STEPS):
        step(*batch(100 * s + RANK))
    return [v.numpy() for v in model.trainable_variables], before, evaluate()


def sparse_instance(method):
    """The BaseCompressor that ``method`` runs on, or None for Horovod's own."""
    if isinstance(method, type) and issubclass(method, BaseCompressor):
        return method.instance()
    return method if isinstance(method, BaseCompressor) else None


cases = [(name, method, 0) for name, method in sorted(COMPRESSORS.items())]
cases.append(("variance/microbatches", VarianceCompressor(variance="microbatches"), 4))
for name, method, microbatches in cases:
    weights, before, after = train(method, microbatches)
    assert_same_on_all_ranks(weights, f"{name} weights")
    check(after < before, f"{name}: loss did not decrease ({before:.4f} -> {after:.4f})")
    sparse = sparse_instance(method)
    check(sparse is None or summary(sparse)["total_sent_bytes"] > 0, f"{name}: no sparse exchange happened")
    ok(f"{name}: ranks bit-identical, loss {before:.4f} -> {after:.4f}")
ok(f"registry checks passed for {len(cases)} methods on {SIZE} ranks")
