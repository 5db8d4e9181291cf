"""SIDCo: thresholds from fitted sparsity-inducing distributions.

Abdelmoniem, Elzanaty, Alouini, Canini 2021, "An Efficient Statistical-based
Gradient Compression Technique for Distributed Training Systems" (MLSys,
arXiv:2101.10761). The magnitudes ``x = |a|`` of the accumulated gradient are
modelled by a sparsity-inducing distribution whose tail gives the threshold
for a target density ``delta`` in closed form:

* exponential (mean ``mu``): ``eta = -mu * ln(delta)``;
* gamma (shape ``k``, scale ``theta``), closed-form approximate MLE
  ``k = (3 - s + sqrt((s - 3)^2 + 24 s)) / (12 s)``, ``s = ln E[x] - E[ln x]``,
  ``theta = E[x] / k``; ``eta = theta * Q(k, delta)`` with ``Q`` the upper
  tail quantile of the standard gamma (bisection on ``igammac``);
* generalized Pareto (shape ``xi``, scale ``sigma``), moment fit
  ``xi = (1 - E[x]^2 / Var x) / 2``, ``sigma = E[x] (1 + E[x]^2 / Var x) / 2``;
  ``eta = sigma * (delta^-xi - 1) / xi``.

Multi-stage fitting: stage 1 fits all ``x`` for density ``delta^(1/stages)``;
each later stage refits the same family to the exceedances ``x - eta`` beyond
the previous threshold and moves it on by the new tail, so the stage
densities multiply to ``delta``. Exceedances of an exponential are again
exponential and those of a generalized Pareto again generalized Pareto, so
these two are exact; for the gamma refitting the exceedances is an
approximation. Elements with ``|a| > eta`` are sent. Each stage's fit needs
only masked sums over the tensor (count, mean, mean log, mean square of the
exceedances), so the stages and the mask compile into one call that reads
the tensor once per stage; the mask is the step's compiled mask pass.

Deviations: a fixed number of stages (the paper adapts it from the density
achieved); exact zeros are left out of the fits and of the count the density
refers to; a fit that degenerates (e.g. all values equal) falls back to the
exponential tail for that stage.
"""
import math
from typing import NamedTuple

import tensorflow as tf

from hvd_gradpart import fused
from hvd_gradpart.compressors.sparse import SparseCompressor

FAMILIES = ("exponential", "gamma", "gpareto")
_BISECTIONS = 80


class Moments(NamedTuple):
    """Moments of the exceedances ``y = x - eta`` of the elements with ``x > eta``."""

    count: tf.Tensor
    mean: tf.Tensor
    mean_log: tf.Tensor
    variance: tf.Tensor


def exceedance_moments(x, eta):
    """``Moments`` of ``x - eta`` over ``x > eta`` (float64; masked sums, one pass over ``x``)."""
    beyond = x > eta
    y = tf.where(beyond, x - eta, tf.zeros_like(x))
    count = tf.reduce_sum(tf.cast(beyond, tf.float64))
    mean = lambda v: tf.reduce_sum(v) / count
    m1 = mean(y)
    return Moments(count, m1, mean(tf.where(beyond, tf.math.log(tf.where(beyond, y, 1.0)), 0.0)),
                   mean(tf.square(y)) - tf.square(m1))


def exponential_tail(m, delta):
    """Threshold with tail mass ``delta`` of an exponential fitted to the exceedances."""
    return -m.mean * math.log(delta)


def gamma_tail(m, delta):
    """Threshold with tail mass ``delta`` of a gamma fitted to the exceedances."""
    s = tf.math.log(m.mean) - m.mean_log
    k = (3 - s + tf.sqrt(tf.square(s - 3) + 24 * s)) / (12 * s)

    def halve(lo, hi):
        mid = (lo + hi) / 2
        above = tf.math.igammac(k, tf.exp(mid)) > delta
        return tf.where(above, mid, lo), tf.where(above, hi, mid)

    bounds = (tf.constant(-745.0, tf.float64), tf.math.log(k) + 10.0 - math.log(delta))
    lo, hi = tf.while_loop(lambda *_: tf.constant(True), halve, bounds, maximum_iterations=_BISECTIONS)
    return m.mean / k * tf.exp(hi)


def gpareto_tail(m, delta):
    """Threshold with tail mass ``delta`` of a generalized Pareto fitted to the exceedances."""
    ratio = tf.square(m.mean) / m.variance
    xi = (1 - ratio) / 2
    sigma = m.mean * (1 + ratio) / 2
    safe_xi = tf.where(tf.abs(xi) < 1e-8, tf.ones_like(xi), xi)
    return tf.where(tf.abs(xi) < 1e-8, -sigma * math.log(delta), sigma * (delta ** -safe_xi - 1) / safe_xi)


TAILS = {"exponential": exponential_tail, "gamma": gamma_tail, "gpareto": gpareto_tail}


def multistage_threshold(x, delta, stages, family):
    """SIDCo's threshold on magnitudes ``x`` (float64, zeros allowed)."""
    tail = TAILS[family]
    stage_delta = delta ** (1.0 / stages)
    eta = tf.constant(0.0, tf.float64)
    for _ in range(stages):
        m = exceedance_moments(x, eta)
        fitted = tail(m, stage_delta)
        fitted = tf.where(tf.math.is_finite(fitted) & (fitted > 0), fitted, exponential_tail(m, stage_delta))
        eta = tf.where(m.count > 0, eta + fitted, eta)
    return eta


class SIDCoCompressor(SparseCompressor):
    """Statistical threshold for a target density, from a fitted tail.

    Args:
        delta: target fraction of (nonzero) elements sent, in (0, 1).
        stages: fitting stages, an int in [1, 8].
        family: "exponential", "gamma" or "gpareto".
        **kwargs: see ``SparseCompressor``.
    """

    DIAGNOSTICS = ("threshold",)

    def __init__(self, delta=0.001, stages=2, family="exponential", **kwargs):
        super().__init__(**kwargs)
        _check("delta", delta, 0.0 < delta < 1.0, "in (0, 1)")
        _check("stages", stages, isinstance(stages, int) and 1 <= stages <= 8, "an int in [1, 8]")
        _check("family", family, family in FAMILIES, f"one of {FAMILIES}")
        self.delta, self.stages, self.family = delta, stages, family

    def prepare(self, residual, grad, state, slot):
        return fused.by_size(self._threshold, grad.shape.num_elements())(residual, grad, state)

    @tf.function(jit_compile=True)
    def _threshold(self, residual, grad, state):
        """The threshold on ``|acc|``: ``acc`` and every stage's fit in one compiled call."""
        acc, _ = self.accumulate(residual, grad, state)
        return multistage_threshold(tf.cast(tf.abs(acc), tf.float64), self.delta, self.stages, self.family)

    def mask(self, acc, grad, state, plan):
        return tf.abs(acc) > tf.cast(plan, acc.dtype)

    def select(self, swept, grad, slot):
        return swept.candidates.indices, {"threshold": swept.plan}


def _check(name, value, ok, valid):
    if not ok:
        raise ValueError(f"SIDCoCompressor: {name} must be {valid}, got {value!r}")
