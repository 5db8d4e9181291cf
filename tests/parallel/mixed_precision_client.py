"""Mixed precision under every compressor: an overflow on one rank skips the step on every rank.

Each name in ``--compression`` trains a fresh small model under the ``mixed_float16`` policy with
Keras's dynamic loss scaling for ``--steps`` steps, in a ``DistributedGradientTape`` loop with a
``LossScaleOptimizer`` (``--mode tape``) or in ``model.fit`` with ``hvd.DistributedOptimizer``,
which ``compile`` wraps in one (``--mode fit``). At step ``--overflow-at`` rank 1 alone
multiplies its loss by Inf, as a loss scale that overflowed on one rank does. As with Horovod's
dense sum, every rank must then see a sum that is not finite, skip that step and halve its loss
scale; training goes on, and the ranks' weights stay finite and bit-identical. ``--mode plain``
trains in float32 without loss scaling: rank 1's NaN is then the user's, and, as under Horovod's
dense sum, it must reach every rank's weights while the run goes on to its end, no rank left
waiting in a collective. Rank 0 prints ``OK <mode> <name> ...`` per name.

Usage: ``horovodrun -np 2 python mixed_precision_client.py --mode tape --compression none gradpart``.
"""
import argparse

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart import get_compressor

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--mode", choices=["tape", "fit", "plain"], default="tape")
parser.add_argument("--compression", nargs="+", default=["none", "gradpart"])
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--overflow-at", type=int, default=20)
args = parser.parse_args()

rank, size = init()
if args.mode != "plain":
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
BATCH = 32
rs = np.random.RandomState(0)
truth = rs.randn(32, 10).astype(np.float32)
x_all = rs.randn(BATCH * size * args.steps, 32).astype(np.float32)
y_all = np.argmax(x_all @ truth, axis=1)
x, y = x_all[rank::size], y_all[rank::size]  # Horovod: every rank its own shard
boost = tf.Variable(1.0, trainable=False)  # Inf on rank 1 at the overflow step only
cross_entropy = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def loss_fn(labels, logits):
    return cross_entropy(labels, logits) * boost


def boost_at(step):
    return float("inf") if rank == 1 and step == args.overflow_at else 1.0


def build_model():
    tf.keras.utils.set_random_seed(1)  # the same initial weights on every rank
    return tf.keras.Sequential([
        tf.keras.Input([32]),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
        tf.keras.layers.Activation("linear", dtype="float32"),  # float32 logits, as the mixed-precision guide does
    ])


def train_tape(compression):
    model = build_model()
    opt = tf.keras.optimizers.SGD(0.2)
    if args.mode == "tape":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
            scaled = opt.get_scaled_loss(loss) if args.mode == "tape" else loss
        # Horovod: the compressor under test, on the scaled gradients.
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, model.trainable_variables)
        if args.mode == "tape":
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for s in range(args.steps):
        boost.assign(boost_at(s))
        step(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH])
    return model, opt, args.steps


class Overflow(tf.keras.callbacks.Callback):
    """Sets ``boost`` before each batch; counts the batches."""

    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_batch_begin(self, batch, logs=None):
        boost.assign(boost_at(self.step))
        self.step += 1


def train_fit(compression):
    model = build_model()
    # Horovod: compile wraps the distributed optimizer in a LossScaleOptimizer under mixed_float16.
    model.compile(optimizer=hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.2), compression=compression),
                  loss=loss_fn)
    check(isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer),
          f"compile did not wrap the optimizer in a LossScaleOptimizer: {type(model.optimizer)}")
    overflow = Overflow()
    model.fit(x[:args.steps * BATCH], y[:args.steps * BATCH], batch_size=BATCH, epochs=1, shuffle=False,
              verbose=0, callbacks=[overflow])
    return model, model.optimizer, overflow.step


def data_loss(model):
    """The model's loss on this rank's whole shard."""
    return float(cross_entropy(y, model(x, training=False)))


for name in args.compression:
    compression = get_compressor(name)
    initial = data_loss(build_model())
    model, opt, steps = (train_fit if args.mode == "fit" else train_tape)(compression)
    what = f"{args.mode} {name}"
    check(steps == args.steps, f"{what}: trained {steps} of {args.steps} steps")
    weights = [w.numpy() for w in model.weights]
    if args.mode == "plain":
        nan = [not np.isfinite(w).all() for w in weights]
        check(all(nan), f"{what}: rank 1's NaN did not reach every weight of this rank: {nan}")
        ok(f"{what} NaN on rank 1 reached every weight on every rank; the run ended")
        continue
    scale = float(opt.loss_scale)
    check(all(np.isfinite(w).all() for w in weights), f"{what}: weights not finite after the overflow")
    assert_same_on_all_ranks(weights + [np.array([scale], np.float32)], f"{what}: weights and loss scale")
    check(scale == 2.0 ** 15 / 2, f"{what}: loss scale {scale}, want one halving from 2**15 (the one overflow)")
    memory = getattr(compression, "memory", None)
    residuals = [s.residual.numpy() for s in memory.slots.values()] if memory is not None else []
    check(all(np.isfinite(r).all() for r in residuals), f"{what}: a residual took NaN or Inf")
    final = data_loss(model)
    check(final < 0.9 * initial, f"{what}: did not train on after the overflow: loss {initial:.3f} -> {final:.3f}")
    ok(f"{what} loss {initial:.3f} -> {final:.3f}, loss scale {scale:.0f} on {size} ranks")
