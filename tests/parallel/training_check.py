"""Training through Horovod's own wrappers with a sparse compressor.

Checks, on every rank count: ranks stay bit-identical; with everything sent
(ratio 1) the result equals dense training, for each reduction option;
retracing reuses the same residuals.
"""
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart import TopKCompressor

RANK, SIZE = init()
STEPS = 3


def make_model():
    tf.keras.utils.set_random_seed(5)
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="tanh"),
                                 tf.keras.layers.Dense(10)])
    return model


def batch(step, size=16):
    rs = np.random.RandomState(100 * step + RANK)
    return rs.randn(size, 32).astype(np.float32), rs.randint(0, 10, size).astype(np.int32)


LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def train_tape(compression, mode, **tape_kwargs):
    model = make_model()
    opt = tf.keras.optimizers.SGD(0.1)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, **tape_kwargs)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step = tf.function(step) if mode == "function" else step
    for s in range(STEPS):
        step(*batch(s))
    return [v.numpy() for v in model.trainable_variables]


def close(a, b):
    return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


def check_tape():
    variants = [dict(), dict(op=hvd.Sum), dict(gradient_predivide_factor=2.0), dict(num_groups=2)]
    for mode in ("eager", "function"):
        for kwargs in variants:
            what = f"DistributedGradientTape {mode} {kwargs}"
            sparse = train_tape(TopKCompressor(ratio=0.05), mode, **kwargs)
            assert_same_on_all_ranks(sparse, what)
            everything = train_tape(TopKCompressor(ratio=1.0), mode, **kwargs)
            dense = train_tape(hvd.Compression.none, mode, **kwargs)
            check(close(everything, dense), f"{what}: ratio=1 differs from dense")
            check(not close(sparse, dense), f"{what}: ratio=0.05 looks dense")
    ok("DistributedGradientTape eager/function, Average/Sum/predivide/num_groups")


def check_class_and_retrace():
    model = make_model()
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=TopKCompressor)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step(*batch(0, 16))
    keys = sorted(TopKCompressor.instance().memory.slots)
    step(*batch(1, 8))  # another batch size: a retrace
    check(step.experimental_get_tracing_count() >= 2, "no retrace happened")
    check(sorted(TopKCompressor.instance().memory.slots) == keys, "retrace made new residuals")
    check(len(keys) == 1, f"one kernel is large enough to sparsify, got slots {keys}")
    assert_same_on_all_ranks([v.numpy() for v in model.trainable_variables], "class-passed weights")
    ok("class passed as compression; retrace keeps residual identity")


def train_keras(compression):
    model = make_model()
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression)
    model.compile(optimizer=opt, loss=LOSS)
    x, y = zip(*(batch(s) for s in range(STEPS)))
    model.fit(np.concatenate(x), np.concatenate(y), batch_size=16, epochs=2, shuffle=False, verbose=0)
    return [v.numpy() for v in model.trainable_variables]


def check_keras():
    sparse = train_keras(TopKCompressor(ratio=0.05))
    assert_same_on_all_ranks(sparse, "keras fit")
    check(close(train_keras(TopKCompressor(ratio=1.0)), train_keras(hvd.Compression.none)),
          "keras fit: ratio=1 differs from dense")
    ok("Keras model.fit with horovod.tensorflow.keras.DistributedOptimizer")


def train_legacy(compression):
    model = make_model()
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                   compression=compression)
    for s in range(STEPS):
        x, y = batch(s)
        opt.minimize(lambda: LOSS(y, model(x, training=True)), var_list=model.trainable_variables)
    return [v.numpy() for v in model.trainable_variables]


def check_legacy():
    sparse = train_legacy(TopKCompressor(ratio=0.05))
    assert_same_on_all_ranks(sparse, "legacy optimizer")
    check(close(train_legacy(TopKCompressor(ratio=1.0)), train_legacy(hvd.Compression.none)),
          "legacy optimizer: ratio=1 differs from dense")
    ok("hvd.DistributedOptimizer with the TF legacy optimizer")


check_tape()
check_class_and_retrace()
check_keras()
check_legacy()
ok(f"training checks passed on {SIZE} ranks")
