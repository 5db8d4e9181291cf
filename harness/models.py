"""Benchmark models, built by name.

Every model takes float images ``(H, W, C)`` in ``[0, 1]`` and returns logits
``(batch, num_classes)``; train with ``from_logits=True``. Initializers carry
explicit seeds derived from ``seed``, so a model is the same on every rank.
"""
import functools
import itertools
import math

import tensorflow as tf

layers = tf.keras.layers


class PixelTokens(layers.Layer):
    """Turns a float image into one token per pixel: ``position * levels + level``.

    ``level`` is the pixel value in ``[0, 1]`` quantized to ``levels`` bins, so
    every (position, level) pair owns one row of a ``n_pixels * levels``
    vocabulary.
    """

    def __init__(self, levels=16, **kwargs):
        super().__init__(**kwargs)
        self.levels = levels

    def call(self, images):
        flat = tf.reshape(images, [tf.shape(images)[0], -1])
        level = tf.clip_by_value(tf.cast(tf.floor(flat * self.levels), tf.int32), 0, self.levels - 1)
        return tf.range(tf.shape(flat)[1]) * self.levels + level

    def get_config(self):
        return {**super().get_config(), "levels": self.levels}


def _seeds(seed, init=tf.keras.initializers.GlorotUniform):
    """Yields initializers of class ``init`` with seeds ``seed, seed + 1, ...``."""
    return (init(seed=s) for s in itertools.count(seed))


def _dense(units, init, activation="relu"):
    return layers.Dense(units, activation=activation, kernel_initializer=next(init))


def _mlp(inputs, num_classes, seed):
    init = _seeds(seed)
    x = layers.Flatten()(inputs)
    x = _dense(1024, init)(x)
    x = _dense(1024, init)(x)
    return _dense(num_classes, init, activation=None)(x)


def _lenet5(inputs, num_classes, seed):
    init = _seeds(seed)
    x = inputs
    for filters in (6, 16):
        x = layers.Conv2D(filters, 5, padding="same", activation="relu", kernel_initializer=next(init))(x)
        x = layers.MaxPooling2D(2, padding="same")(x)
    x = layers.Flatten()(x)
    x = _dense(120, init)(x)
    x = _dense(84, init)(x)
    return _dense(num_classes, init, activation=None)(x)


def _conv_bn(x, filters, kernel, strides, init):
    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                      kernel_initializer=next(init))(x)
    return layers.BatchNormalization()(x)


def _resnet(inputs, num_classes, seed, blocks):
    """CIFAR ResNet-(6 blocks + 2) (He et al. 2016): 3 stages x ``blocks`` basic blocks,
    projection shortcuts."""
    init = _seeds(seed, tf.keras.initializers.HeNormal)
    x = layers.ReLU()(_conv_bn(inputs, 16, 3, 1, init))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            y = layers.ReLU()(_conv_bn(x, filters, 3, strides, init))
            y = _conv_bn(y, filters, 3, 1, init)
            if strides != 1:
                x = _conv_bn(x, filters, 1, strides, init)
            x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    return layers.Dense(num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed))(x)


# MobileNetV2's inverted residual stages (Sandler et al. 2018): expansion t, channels c, blocks n, stride s.
_MOBILENETV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(channels, by=8):
    """MobileNet's channel rounding: the nearest multiple of ``by``, never 10 % below ``channels``."""
    rounded = max(by, int(channels + by / 2) // by * by)
    return rounded + by if rounded < 0.9 * channels else rounded


def _mobilenetv2(inputs, num_classes, seed, width=0.5, size=64):
    """MobileNetV2 at width ``width`` on images resized to ``size`` x ``size``: 158 gradient
    tensors (52 convolutions, 17 of them depthwise, their BatchNorms, the classifier); at
    these defaults a step on 28x28 digits costs about what ResNet-20's does."""
    init = _seeds(seed, tf.keras.initializers.HeNormal)
    relu6 = lambda x: layers.ReLU(6.0)(layers.BatchNormalization()(x))
    x = layers.Resizing(size, size)(inputs)
    x = relu6(layers.Conv2D(_divisible(32 * width), 3, strides=2, padding="same", use_bias=False,
                            kernel_initializer=next(init))(x))
    for expansion, channels, blocks, stride in _MOBILENETV2_STAGES:
        out = _divisible(channels * width)
        for block in range(blocks):
            y = x
            if expansion != 1:
                y = relu6(layers.Conv2D(expansion * x.shape[-1], 1, use_bias=False, kernel_initializer=next(init))(y))
            y = relu6(layers.DepthwiseConv2D(3, strides=stride if block == 0 else 1, padding="same", use_bias=False,
                                             depthwise_initializer=next(init))(y))
            y = layers.BatchNormalization()(layers.Conv2D(out, 1, use_bias=False, kernel_initializer=next(init))(y))
            x = layers.Add()([x, y]) if y.shape[1:] == x.shape[1:] else y
    x = relu6(layers.Conv2D(1280, 1, use_bias=False, kernel_initializer=next(init))(x))
    x = layers.GlobalAveragePooling2D()(x)
    return layers.Dense(num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed))(x)


def _embedding(inputs, num_classes, seed, levels=16, dim=16):
    """Pixel tokens -> Embedding (sparse ``tf.IndexedSlices`` gradient) -> mean -> dense."""
    init = _seeds(seed)
    n_pixels = math.prod(inputs.shape[1:])
    tokens = PixelTokens(levels)(inputs)
    x = layers.Embedding(n_pixels * levels, dim, embeddings_initializer=tf.keras.initializers.RandomUniform(
        -0.05, 0.05, seed=seed))(tokens)
    x = layers.GlobalAveragePooling1D()(x)
    x = _dense(64, init)(x)
    return _dense(num_classes, init, activation=None)(x)


_BUILDERS = {"mlp": _mlp, "lenet5": _lenet5,
             "resnet20": functools.partial(_resnet, blocks=3),
             "embedding": _embedding,
             # 137 gradient tensors (45 convolutions, their BatchNorms, the classifier)
             "resnet44": functools.partial(_resnet, blocks=7),
             "mobilenetv2": _mobilenetv2}
MODELS = tuple(_BUILDERS)
DIGITS = (28, 28, 1)  # MNIST's images (mnist5k, mnist): what the evaluation trains every model on
CIFAR = (32, 32, 3)   # CIFAR-10's
# Each model's input where a benchmark times it on synthetic batches: the ResNets at CIFAR-10's size.
SHAPES = {"mlp": DIGITS, "lenet5": DIGITS, "resnet20": CIFAR, "embedding": DIGITS, "resnet44": CIFAR,
          "mobilenetv2": DIGITS}


def build_model(name, input_shape, num_classes, seed=0):
    """Builds a benchmark model.

    Args:
        name: one of ``MODELS``.
        input_shape: image shape ``(H, W, C)``.
        num_classes: number of output logits.
        seed: base seed of the initializers.

    Returns:
        A ``tf.keras.Model`` mapping images to logits.

    Raises:
        ValueError: ``name`` is not in ``MODELS``.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}")
    inputs = tf.keras.Input(shape=tuple(input_shape))
    return tf.keras.Model(inputs, _BUILDERS[name](inputs, num_classes, seed), name=name)
