"""PowerSGD: a rank-r approximation of each matrix-shaped gradient, with error feedback.

Vogels, Karimireddy, Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization" (NeurIPS, arXiv:1905.13727), as
PyTorch's DDP hook ``powerSGD_hook`` runs it. A gradient of shape
``(..., out)`` is the matrix ``M = reshape(g, [-1, out])^T`` of shape
``(out, fan_in)``: for a Keras kernel (Dense ``(in, out)``, conv HWIO
``(kh, kw, in, out)``) that is the matrix the hook forms from the same
layer's PyTorch weight ``(out, in[, kh, kw])``, so ``P`` lies on the output
axis and ``Q`` on the fan-in axis (the code keeps ``M^T``, the reshape, and
never transposes). ``compress`` adds the residual (``M = G + R``), computes
``P = M Q`` from the ``Q`` kept since the last step (a warm start: one step of
power iteration per training step), sums ``P`` over ranks with
``hvd.allreduce``, orthonormalises it (QR: every rank holds the same ``P``),
computes this rank's ``Q = M^T P`` and sums those too. ``P Q^T`` is then the
projection ``P P^T`` of the ranks' summed ``M``; each rank keeps its ``M`` less
the mean ``P Q^T / N`` as its residual (as the hook and the authors' code
do), and the mean ``Q`` starts the next step. Horovod's own allreduce runs on
``exchange.marker()``, so ``decompress`` scales the sum by
``exchange.marker_scale``: the reduction the caller asked for. Vectors,
tensors below ``min_elements`` and matrices that ``P`` and ``Q`` would not
shrink ``min_compression_rate`` times go dense; for the first
``warmup_steps`` steps every matrix also goes dense, through its own
allreduce of ``M``, and its residual stays empty. When a rank's ``M`` holds
NaN or Inf (an overflow under mixed precision), the sums are not finite on
every rank and are handed on as they are, as Horovod's dense sum would be;
every rank then keeps its residual, ``Q`` and step count as they were.
"""
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_gradpart import exchange
from hvd_gradpart.compressors.base import BaseCompressor, _OnDefaultInstance


class Reduced(NamedTuple):
    """What ``compress`` hands ``decompress``: the sum over ranks and the gradient it replaces."""

    total: tf.Tensor
    original: tf.Tensor


class PowerSGDCompressor(BaseCompressor):
    """Rank-``rank`` PowerSGD with error feedback and a warm-started ``Q``.

    Args:
        rank: columns of ``P`` and ``Q`` (the hook's ``matrix_approximation_rank``); int >= 1.
        warmup_steps: steps sent dense before compression starts (the hook's
            ``start_powerSGD_iter``); int >= 0.
        min_compression_rate: a matrix is compressed only when ``P`` and ``Q``
            are more than this many times smaller than it; >= 1.
        seed: seed of the initial ``Q``, the same on every rank; int.
        min_elements: tensors with fewer elements go dense (see ``BaseCompressor``).
    """

    def __init__(self, rank=1, warmup_steps=0, min_compression_rate=2.0, seed=0, min_elements=1024):
        super().__init__(min_elements=min_elements)
        _check("rank", rank, isinstance(rank, int) and rank >= 1, "an int >= 1")
        _check("warmup_steps", warmup_steps, isinstance(warmup_steps, int) and warmup_steps >= 0, "an int >= 0")
        _check("min_compression_rate", min_compression_rate,
               isinstance(min_compression_rate, (int, float)) and 1 <= min_compression_rate < float("inf"),
               "a finite number >= 1")
        _check("seed", seed, isinstance(seed, int), "an int")
        self.rank, self.warmup_steps, self.seed = rank, warmup_steps, seed
        self.min_compression_rate = float(min_compression_rate)

    def sums_in_compress(self):
        return True

    def view(self, tensor):
        """``(fan_in, out, r)`` when ``tensor`` is compressed (module doc), else None."""
        if not self.sparsifies(tensor) or tensor.shape.rank < 2:
            return None
        out = tensor.shape[-1]
        fan_in = tensor.shape.num_elements() // out
        r = min(self.rank, fan_in, out)
        return (fan_in, out, r) if (fan_in + out) * r * self.min_compression_rate < fan_in * out else None

    def _compress(self, tensor):
        """Sends a matrix as ``P`` and ``Q``, anything else dense; returns ``(marker or tensor, ctx)``."""
        view = self.view(tensor)
        return self._allreduced(tensor) if view is None else self._low_rank(tensor, *view)

    def _allreduced(self, tensor):
        """A tensor PowerSGD does not compress: through Horovod's allreduce, or,
        when its dtype is not the marker's (a group takes one dtype), its own."""
        n, alone = tensor.shape.num_elements(), tensor.dtype != exchange.MARKER_DTYPE
        _record(self.memory.slot(tensor), tensor, n, n * tensor.dtype.size + alone * exchange.MARKER_DTYPE.size)
        return (exchange.marker(), Reduced(hvd.allreduce(tensor, op=hvd.Sum), tensor)) if alone else (tensor, None)

    def _low_rank(self, tensor, fan_in, out, r):
        """The module doc's step for ``M^T`` of shape ``(fan_in, out)`` at rank ``r``."""
        dtype = tf.float32 if tensor.dtype.size < 4 else tensor.dtype
        start = [self.seed, exchange.digest(f"{fan_in}x{out}")]
        slot = self.memory.slot(tensor, {
            "q": lambda n, _: tf.random.stateless_normal([fan_in, r], start, dtype=dtype),
            "step": lambda n, _: tf.constant(0, tf.int64)})
        residual, kept_q = slot.residual.value(), slot.state["q"].value()
        acc = residual + tf.reshape(tensor, [-1])
        m_t = tf.reshape(tf.cast(acc, dtype), [fan_in, out])
        if self.warmup_steps:
            dense = slot.state["step"] < self.warmup_steps
            total, delivered, q = tf.cond(dense, lambda: (hvd.allreduce(m_t, op=hvd.Sum), m_t, kept_q),
                                          lambda: power_step(m_t, kept_q))
        else:
            dense, (total, delivered, q) = False, power_step(m_t, kept_q)
        finite = tf.reduce_all(tf.math.is_finite(acc)) & tf.reduce_all(tf.math.is_finite(q))
        residual, q = tf.cond(finite, lambda: (acc - tf.cast(tf.reshape(delivered, [-1]), acc.dtype), q),
                              lambda: (residual, kept_q))
        slot.residual.assign(residual, read_value=False)
        slot.state["q"].assign(q, read_value=False)
        slot.state["step"].assign_add(tf.cast(finite, tf.int64), read_value=False)
        sent = tf.where(dense, fan_in * out, (fan_in + out) * r)
        _record(slot, tensor, sent, sent * dtype.size + exchange.MARKER_DTYPE.size, rank=r)
        return exchange.marker(), Reduced(total, tensor)

    @_OnDefaultInstance
    def decompress(self, tensor, ctx):
        """The sum ``compress`` reduced, scaled by the reduced marker; anything else as the base does."""
        if not isinstance(ctx, Reduced):
            return super().decompress(tensor, ctx)
        total = ctx.total * tf.cast(exchange.marker_scale(tensor), ctx.total.dtype)
        return tf.reshape(tf.cast(total, ctx.original.dtype), ctx.original.shape)


def power_step(m_t, q):
    """One round of rank-r power iteration on ``M`` across ranks, given ``M^T`` (module doc).

    Args:
        m_t: this rank's ``M^T``, ``(fan_in, out)``.
        q: the warm-start ``Q``, ``(fan_in, r)``, the same on every rank.

    Returns:
        ``(sum over ranks, mean over ranks, next Q)``: the first two as
        ``(P Q^T)^T`` of shape ``(fan_in, out)``, the third ``(fan_in, r)``.
    """
    p = hvd.allreduce(tf.matmul(m_t, q, transpose_a=True), op=hvd.Sum)
    p = tf.linalg.qr(p).q
    q_sum = hvd.allreduce(tf.matmul(m_t, p), op=hvd.Sum)
    total = tf.matmul(q_sum, p, transpose_b=True)
    ranks = tf.cast(exchange.world_size(), total.dtype)
    return total, total / ranks, q_sum / ranks


def _record(slot, tensor, sent_elements, sent_bytes, **diagnostics):
    """One step's figures of ``tensor`` in its slot's metrics."""
    n = tensor.shape.num_elements()
    slot.metrics.record(elements=n, dense_bytes=n * tensor.dtype.size, sent_elements=sent_elements,
                        sent_bytes=sent_bytes, **diagnostics)


def _check(name, value, ok, valid):
    if isinstance(value, bool) or not ok:
        raise ValueError(f"PowerSGDCompressor: {name} must be {valid}, got {value!r}")
