"""Exact Top-k sparsification with error feedback.

Sends the ``ceil(ratio * n)`` entries of largest magnitude of the accumulated
gradient (``tf.math.top_k``); the rest stays in the residual. Error feedback
as in Stich et al. 2018, "Sparsified SGD with Memory".
"""
import math

import tensorflow as tf

from hvd_gradpart.compressors.base import SparseCompressor


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

    def select(self, acc, grad, slot):
        k = max(1, math.ceil(self.ratio * acc.shape.num_elements()))
        _, indices = tf.math.top_k(tf.abs(acc), k=k, sorted=False)
        return indices, {}
