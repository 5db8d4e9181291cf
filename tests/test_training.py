"""The shared training helpers: BatchNorm recalibration before evaluation."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from harness import training  # noqa: E402
from harness.models import build_model  # noqa: E402


def conv_bn_model():
    inputs = tf.keras.Input((4, 4, 2))
    x = tf.keras.layers.BatchNormalization(name="bn")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.GlobalAveragePooling2D()(x))


def test_moving_statistics_become_the_mean_of_batch_statistics():
    x = np.random.default_rng(0).normal(3.0, 2.0, (12, 4, 4, 2)).astype(np.float32)
    x[4:8] += 5.0  # batches with different means: a moving average would weight them unequally
    model = conv_bn_model()
    assert training.recalibrate_batchnorm(model, x, batch_size=4, batches=3) == 1
    bn = model.get_layer("bn")
    per_batch = x.reshape(3, -1, 2)
    np.testing.assert_allclose(bn.moving_mean.numpy(), per_batch.mean(axis=1).mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), per_batch.var(axis=1, ddof=1).mean(axis=0),
                               rtol=1e-4)
    assert bn.momentum == 0.99, "the layer's own momentum must come back"


def test_uses_at_most_the_batches_there_are_and_leaves_weights_alone():
    model = conv_bn_model()
    x = np.ones((5, 4, 4, 2), np.float32)
    weights = [w.copy() for w in model.get_layer("bn").get_weights()[:2]]  # gamma, beta
    training.recalibrate_batchnorm(model, x, batch_size=4, batches=20)
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(), [1.0, 1.0])
    for before, after in zip(weights, model.get_layer("bn").get_weights()[:2]):
        np.testing.assert_array_equal(before, after)


def test_models_without_batchnorm_are_untouched():
    model = build_model("mlp", (8, 8, 1), 10)
    before = [w.copy() for w in model.get_weights()]
    assert training.recalibrate_batchnorm(model, np.zeros((8, 8, 8, 1), np.float32)) == 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
