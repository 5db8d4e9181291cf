"""Exact Top-k sparsification with error feedback.

Sends the ``ceil(ratio * n)`` entries of largest magnitude of the accumulated
gradient; the rest stays in the residual. Error feedback as in Stich et al.
2018, "Sparsified SGD with Memory".

``tf.math.top_k`` over the whole tensor costs many elementwise passes, so it
runs on candidates: a strided sample of ``|acc|`` gives a threshold ``t``
whose sample rank is three standard deviations beyond the expected count of
top-k elements in the sample, the step's compiled mask pass marks the nonzero
elements with ``|acc| >= t``, and top-k runs among them. When at least ``k`` pass, the
k-th largest magnitude is ``>= t``, so every top-k element is a candidate and
the result is the exact top-k; otherwise (rare, or too many zeros) top-k runs
over the whole tensor.
"""
import math

import tensorflow as tf

from hvd_gradpart import fused, stats
from hvd_gradpart.compressors.sparse import SparseCompressor

SAMPLE_SIZE = 4096


class TopKCompressor(SparseCompressor):
    """Top-k by magnitude.

    Args:
        ratio: fraction of each tensor's elements sent per step, in (0, 1].
        **kwargs: see ``SparseCompressor``.
    """

    def __init__(self, ratio=0.01, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        self.ratio = ratio

    def k(self, n):
        """Elements sent from an ``n``-element tensor."""
        return max(1, math.ceil(self.ratio * n))

    def prepare(self, residual, grad, state, slot):
        n = residual.shape.num_elements()
        sample = self.accumulated_at(residual, grad, state, lambda x: stats.strided_sample(x, SAMPLE_SIZE))
        return sampled_threshold(sample, self.k(n), n)

    def mask(self, acc, grad, state, plan):
        if plan is None:
            return None
        magnitude = tf.abs(acc)
        return (magnitude >= plan) & (magnitude > 0)

    def select(self, swept, grad, slot):
        return exact_top_k(swept.acc, swept.candidates, self.k(swept.acc.shape.num_elements())), {}


def _top(values, k):
    """Ascending indices of the ``k`` entries of largest magnitude."""
    return tf.sort(tf.math.top_k(tf.abs(values), k=k, sorted=False).indices)


def top_among(x, candidates, k):
    """Ascending indices of the ``k`` entries of largest magnitude of flat ``x`` among
    ``candidates`` (``fused.Candidates``, at least ``k`` of them)."""
    return tf.gather(candidates.indices, _top(tf.gather(x, candidates.indices), k))


def sampled_threshold(sample, k, n):
    """A magnitude at least ``k`` elements of an ``n``-element tensor probably
    reach (module doc), from its strided ``sample``. When the sample cannot
    narrow ``k`` down: None when ``k``, ``n`` and the sample's length are
    Python ints, else +inf (no candidates)."""
    sample = tf.abs(sample)
    m = sample.shape.num_elements()
    if isinstance(k, int) and isinstance(n, int) and m is not None:
        expected = k * m / n
        rank = math.ceil(expected + 3 * math.sqrt(expected) + 2)
        return None if rank >= m else tf.reduce_min(tf.math.top_k(sample, k=rank, sorted=False).values)
    m = tf.size(sample)
    expected = tf.cast(k, tf.float64) * tf.cast(m, tf.float64) / tf.cast(n, tf.float64)
    rank = tf.cast(tf.math.ceil(expected + 3 * tf.sqrt(expected) + 2), tf.int32)
    t = tf.reduce_min(tf.math.top_k(sample, k=tf.minimum(rank, m), sorted=False).values)
    return tf.where(rank < m, t, tf.constant(float("inf"), sample.dtype))


def exact_top_k(x, candidates, k):
    """Ascending indices of the ``k`` entries of largest magnitude of flat ``x``: among
    ``candidates`` (``fused.Candidates`` of ``|x| >= t``) when ``k`` of them
    passed, else over all of ``x``."""
    return tf.cond(candidates.count >= k, lambda: top_among(x, candidates, k), lambda: _top(x, k))


@tf.function(jit_compile=True, autograph=False)
def _at_least(x, t):
    magnitude = tf.abs(x)
    return fused.mask_bytes(x, (magnitude >= t) & (magnitude > 0))


def top_k(x, k):
    """Ascending indices of the ``k`` entries of largest magnitude of flat, finite ``x``
    (``k`` an int or an int32 scalar tensor), by the module doc's route: a
    sampled threshold, one compiled mask pass, then ``exact_top_k``."""
    n = x.shape.num_elements()
    t = sampled_threshold(stats.strided_sample(x, SAMPLE_SIZE), k, tf.size(x) if n is None else n)
    if t is None:
        return _top(x, k)
    return exact_top_k(x, fused.compact(fused.by_size(_at_least, n)(x, t)), k)
