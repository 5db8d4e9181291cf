"""The small dense Keras model that the compressor checks train under horovodrun."""
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

from harness import training

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model():
    tf.keras.utils.set_random_seed(5)
    return tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="tanh"),
                                tf.keras.layers.Dense(48, activation="tanh"), tf.keras.layers.Dense(10)])


def batch(step, size=16):
    """This rank's batch ``step``: inputs and labels that depend on the rank."""
    rs = np.random.RandomState(100 * step + hvd.rank())
    return rs.randn(size, 32).astype(np.float32), rs.randint(0, 10, size).astype(np.int32)


def train_tape(compression, steps, num_groups=0):
    """Weights after ``steps`` steps of the library's training step (DistributedGradientTape in tf.function)."""
    model = make_model()
    step = training.make_step(model, tf.keras.optimizers.SGD(0.1), compression, num_groups=num_groups)
    for s in range(steps):
        step(*batch(s))
    return [v.numpy() for v in model.trainable_variables]


def fit_keras(compression, steps, epochs=2):
    """Weights after Keras ``model.fit`` with ``horovod.tensorflow.keras.DistributedOptimizer``
    over ``steps`` batches, ``epochs`` times."""
    model = make_model()
    model.compile(optimizer=hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression),
                  loss=LOSS)
    x, y = zip(*(batch(s) for s in range(steps)))
    model.fit(np.concatenate(x), np.concatenate(y), batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return [v.numpy() for v in model.trainable_variables]
