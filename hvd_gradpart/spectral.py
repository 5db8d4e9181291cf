"""GradPart's spectral key area: a matrix gradient's leading directions, sent as factors.

A gradient of shape ``(..., out)`` is viewed, as PowerSGD views it, as ``M^T`` of shape
``(fan_in, out)``. Its key area is the span of ``w`` orthonormal directions ``P`` (``out x w``)
kept warm across steps: each step ``P`` is the sum over ranks of ``M Q`` from the kept
``Q``, orthonormalised (one step of power iteration per training step), and each rank's
share of the key area is its own projection ``M^T P P^T``; the ranks' ``M^T P`` sum under
Horovod's allreduce to ``Q_sum``, so the key area's sum over ranks is ``Q_sum P^T``. What the
factors leave on a rank, its accumulated value and fresh gradient less their projections, is
the sparse area: GradPart's entropy rule picks its outliers for the allgather and error
feedback keeps the rest, so sent plus residual is still every gradient ever handed in.

The width is a result, not a setting. Each direction's energy, what its projection takes out
of the ranks' accumulated values (summed over ranks with ``Q``), is weighed against what the
same bytes would carry as coordinates: direction ``j`` pays when it takes at least the energy
of the ``j``-th run of largest accumulated values that its factors' bytes would buy as sparse
values (``value_bytes`` each plus ``POSITION_BYTES`` for its position), estimated on each rank
from a strided sample of ``SAMPLE`` values and summed over ranks with ``P``; and a run is
worth at least those values at the least one the sparse area sent last step at the link
budget's price (``marginal``), so a direction whose coordinates would not travel still pays
for its link time as a sent value must (``hvd_gradpart.budget``). The next
step's width is the number of directions that pay, one more when all pay and the spectrum
measured so far is flat (its effective rank ``exp(H)``, ``H`` the entropy of the directions'
energy shares, within half a direction of the width: more directions of like energy likely
follow), at most ``max_rank``. Once a direction stopped paying, the width grows past the
last that held only every ``TRIAL_EVERY`` steps (no width flickers step by step). Over the
first ``TRIAL_EVERY`` steps, while ``Q`` warms from its random start, the width stays at least
one; after them, a tensor none of whose directions pays (a convolution kernel that is not low
rank) goes back to coordinates alone and tries one direction again every ``TRIAL_EVERY``
steps. Everything that decides the width is summed over ranks, so every rank takes the same
width, and the same collectives, each step. When a rank's accumulated values hold NaN or Inf
(an overflow under mixed precision) the sums are not finite on every rank: the key area's sum
is handed on as it is (not finite, so the step is skipped everywhere), ``Q``, the width and
its cap stay as they were, and the whole gradient goes to the sparse area, which keeps its
residual where it is not finite.
"""
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_gradpart import exchange, stats

TRIAL_EVERY = 16     # steps between tries of one direction on a tensor sent as coordinates alone
SAMPLE = 4096        # accumulated values sampled (strided) to price the coordinates a direction replaces
POSITION_BYTES = 1.5  # what a sparse value's position costs, about, at the densities a direction buys


class Split(NamedTuple):
    """A gradient divided between the spectral key area and the sparse area."""

    grad: tf.Tensor      # the fresh gradient's part in the sparse area (flat)
    residual: tf.Tensor  # the residual's part in the sparse area: with ``grad``, what the sparse area may send
    total: tf.Tensor     # the key area's sum over ranks (flat; zeros when no direction went)
    width: tf.Tensor     # int32: the directions sent this step


def matrix_shape(shape, max_rank):
    """``(fan_in, out)`` of a gradient whose factors at ``max_rank`` directions are at most half
    its size (so a key area can pay), else None."""
    if shape.rank is None or shape.rank < 2 or shape.num_elements() is None:
        return None
    out = shape[-1]
    fan_in = shape.num_elements() // out
    return (fan_in, out) if 2 * (fan_in + out) * max_rank <= fan_in * out else None


def next_width(energies, coordinates, width, cap):
    """The next step's width and cap (int32), from this step's directions (module doc).

    Args:
        energies: float64 ``[width]``: each direction's energy summed over ranks, largest first.
        coordinates: float64 ``[width]``: the energy of each run of coordinates the same bytes
            buy, summed over ranks, largest first (``coordinate_runs``).
        width: int32: the directions sent this step (>= 1).
        cap: int32: the width it may grow to (the last that held once one did not pay).
    """
    paying = tf.reduce_sum(tf.cast(energies >= coordinates, tf.int32))
    shares = energies / tf.maximum(tf.reduce_sum(energies), 1e-300)
    entropy = -tf.reduce_sum(tf.where(shares > 0, shares * tf.math.log(tf.maximum(shares, 1e-300)), 0.0))
    flat = tf.exp(entropy) >= tf.cast(width, tf.float64) - 0.5
    grow = (paying == width) & flat & (width < cap)
    return paying + tf.cast(grow, tf.int32), tf.where(paying < width, paying, cap)


def coordinate_runs(acc, width, bought):
    """float64 ``[width]``: the energy of the ``width`` successive runs of ``bought`` largest
    values of the flat ``acc`` (run ``j``: the ``j``-th ``bought`` values by magnitude), estimated
    from a strided sample of ``SAMPLE`` values (interpolated between sampled values)."""
    sample = tf.cast(stats.strided_sample(acc, SAMPLE), tf.float64)
    taken = tf.cast(tf.size(sample), tf.float64)
    scale = tf.cast(tf.size(acc), tf.float64) / taken
    cumulative = tf.concat([[0.0], tf.cumsum(tf.sort(tf.square(sample), direction="DESCENDING"))], 0)
    at = tf.minimum(bought / scale * tf.cast(tf.range(width + 1), tf.float64), taken)
    below = tf.cast(tf.floor(at), tf.int32)
    above = tf.minimum(below + 1, tf.size(sample))
    low, high = tf.gather(cumulative, below), tf.gather(cumulative, above)
    energy = (low + (at - tf.floor(at)) * (high - low)) * scale
    return energy[1:] - energy[:-1]


class SpectralKey(tf.Module):
    """The spectral key area of one gradient: its warm ``Q``, its width and the width's cap, the
    same on every rank.

    Args:
        fan_in, out: the gradient's matrix shape (``matrix_shape``).
        max_rank: the most directions it may send.
        value_bytes: what one sparse value costs on the wire (its encoding's size).
        seed: the initial ``Q``'s seed, the same on every rank.
    """

    def __init__(self, fan_in, out, max_rank, value_bytes, seed):
        super().__init__(name="spectral_key")
        self.fan_in, self.out, self.max_rank = fan_in, out, max_rank
        self.bought = 4.0 * (fan_in + out) / (value_bytes + POSITION_BYTES)  # sparse values a direction's bytes buy
        start = [seed, exchange.digest(f"{fan_in}x{out}")]
        self.q = tf.Variable(tf.random.stateless_normal([fan_in, max_rank], start), trainable=False, name="q")
        self.width = tf.Variable(1, trainable=False, name="width")
        self.cap = tf.Variable(max_rank, trainable=False, name="cap")
        self.steps = tf.Variable(tf.zeros([], tf.int64), trainable=False, name="steps")

    def split(self, grad, residual, acc, marginal, outliers=True):
        """This step's ``Split`` of the flat float32 ``grad`` and ``residual``.

        Args:
            acc: their sum.
            marginal: float64: the least value the sparse area sent at the link's price,
                squared (0: no price): the least worth of a value a direction's bytes buy.
            outliers: whether the sparse area sends on a step the key area does (else its
                ``grad`` is zeros and its ``residual`` all the factors left).
        """
        trial = tf.equal(self.steps % TRIAL_EVERY, 0)
        warming = tf.cast(self.steps < TRIAL_EVERY, tf.int32)  # Q still warming from its random start
        width = tf.where(self.width > 0, self.width, tf.cast(trial, tf.int32))
        self.cap.assign(tf.where(trial, self.max_rank, self.cap), read_value=False)
        self.steps.assign_add(1, read_value=False)

        def spectral():
            acc_t = tf.reshape(acc, [self.fan_in, self.out])
            q = self.q[:, :width]
            runs = tf.maximum(coordinate_runs(acc, width, self.bought), self.bought * marginal)
            runs = tf.cast(runs, tf.float32)[None]
            p = hvd.allreduce(tf.concat([tf.matmul(acc_t, q, transpose_a=True), runs], 0), op=hvd.Sum)
            coordinates = tf.cast(p[self.out], tf.float64)
            p = tf.linalg.qr(p[:self.out]).q
            mine = tf.matmul(acc_t, p)
            taken = tf.reduce_sum(tf.square(mine), 0, keepdims=True)
            q_sum = hvd.allreduce(tf.concat([mine, taken], 0), op=hvd.Sum)
            finite = tf.reduce_all(tf.math.is_finite(p)) & tf.reduce_all(tf.math.is_finite(q_sum))
            energies, q_sum = tf.cast(q_sum[self.fan_in], tf.float64), q_sum[:self.fan_in]
            total = tf.reshape(tf.matmul(q_sum, p, transpose_b=True), [-1])
            return tf.cond(finite, lambda: self._taken(grad, acc_t, p, mine, q_sum, energies, coordinates,
                                                       width, warming, total, outliers),
                           lambda: (grad, residual, total, tf.zeros([], tf.int32)))

        def coordinates():
            return grad, residual, tf.zeros_like(grad), width

        return Split(*tf.cond(width > 0, spectral, coordinates))

    def _taken(self, grad, acc_t, p, mine, q_sum, energies, coordinates, width, warming, total, outliers):
        """``split``'s parts once the factors' sums are finite: stores the next ``Q``, width and
        cap; returns the sparse area's gradient and residual, ``total`` and ``width``."""
        order = tf.argsort(energies, direction="DESCENDING")
        width_next, cap = next_width(tf.gather(energies, order), coordinates, width, self.cap)
        self.width.assign(tf.maximum(width_next, warming), read_value=False)
        self.cap.assign(cap, read_value=False)
        ranks = tf.cast(exchange.world_size(), tf.float32)
        self.q.assign(tf.concat([tf.gather(q_sum, order, axis=1) / ranks, self.q[:, width:]], 1), read_value=False)
        flat = lambda x: tf.reshape(x, [-1])
        kept = flat(acc_t - tf.matmul(mine, p, transpose_b=True))
        if not outliers:
            return tf.zeros_like(kept), kept, total, width
        grad_t = tf.reshape(grad, [self.fan_in, self.out])
        fresh = flat(grad_t - tf.matmul(tf.matmul(grad_t, p), p, transpose_b=True))
        return fresh, kept - fresh, total, width

    def sent_bytes(self, width):
        """The bytes this rank sent for the factors at ``width`` (float64)."""
        return tf.cast(width, tf.float64) * 4.0 * (self.fan_in + self.out + 2)
