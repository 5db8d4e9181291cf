"""Key/sparse partition of a gradient from its fitted distribution.

The boundary is where self-information equals the entropy
(``entropy.threshold(fit, 0)``): values beyond it are more surprising than a
typical draw, i.e. the fresh gradient is significant there (key area); the
bulk inside it is the sparse area. For a Gaussian the boundary is one
standard deviation, for a Laplace one scale ``alpha``.
"""
from typing import NamedTuple

import tensorflow as tf

from hvd_gradpart import entropy


class Partition(NamedTuple):
    """Key-area mask over a flat gradient, and the area sizes."""

    key: tf.Tensor
    key_size: tf.Tensor
    sparse_size: tf.Tensor


def boundary(fit):
    """Magnitude separating the key area from the sparse area."""
    return entropy.threshold(fit, 0.0)


def partition(grad, fit):
    """Splits flat ``grad`` into key area (True) and sparse area (False)."""
    edge = tf.cast(boundary(fit), grad.dtype)
    key = tf.abs(grad - tf.cast(fit.mu, grad.dtype)) > edge
    key_size = tf.math.count_nonzero(key, dtype=tf.int64)
    return Partition(key, key_size, tf.size(grad, out_type=tf.int64) - key_size)


def area_sizes(sample, fit, n, valid=None):
    """Key and sparse area sizes (float64, whole numbers) of an ``n``-element
    gradient (``n`` an int or a float64 tensor), estimated from its strided
    ``sample`` (O(sample), not O(n)); ``valid``: a bool mask of the sampled
    elements (``stats.fixed_sample``), all by default."""
    edge = boundary(fit)
    beyond = tf.cast(tf.abs(tf.cast(sample, tf.float64) - fit.mu) > edge, tf.float64)
    if valid is None:
        share = tf.reduce_mean(beyond)
    else:
        share = tf.reduce_sum(beyond * tf.cast(valid, tf.float64)) / tf.reduce_sum(tf.cast(valid, tf.float64))
    key = tf.round(share * n)
    return key, n - key


def select_mask(acc, grad, mu, edge, tau_key, tau_sparse):
    """Elements to send: ``|acc| > tau_key`` in the key area, ``> tau_sparse``
    in the sparse area (elementwise: it runs in GradPart's compiled mask pass)."""
    magnitude = tf.abs(acc)
    return tf.where(tf.abs(grad - mu) > edge, magnitude > tau_key, magnitude > tau_sparse)
