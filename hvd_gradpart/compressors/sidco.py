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
approximation. Elements with ``|a| > eta`` are sent.

Deviations: a fixed number of stages (the paper adapts it from the density
achieved); exact zeros are left out of the fits and of the count the density
refers to; a fit that degenerates (e.g. all values equal) falls back to the
exponential tail for that stage.
"""
import math

import tensorflow as tf

from hvd_gradpart.compressors.base import SparseCompressor

FAMILIES = ("exponential", "gamma", "gpareto")
_BISECTIONS = 80


def exponential_tail(x, delta):
    """Threshold with tail mass ``delta`` of an exponential fitted to ``x > 0``."""
    return -tf.reduce_mean(x) * math.log(delta)


def gamma_tail(x, delta):
    """Threshold with tail mass ``delta`` of a gamma fitted to ``x > 0``."""
    mean = tf.reduce_mean(x)
    s = tf.math.log(mean) - tf.reduce_mean(tf.math.log(x))
    k = (3 - s + tf.sqrt(tf.square(s - 3) + 24 * s)) / (12 * s)

    def halve(lo, hi):
        mid = (lo + hi) / 2
        above = tf.math.igammac(k, tf.exp(mid)) > delta
        return tf.where(above, mid, lo), tf.where(above, hi, mid)

    bounds = (tf.constant(-745.0, tf.float64), tf.math.log(k) + 10.0 - math.log(delta))
    lo, hi = tf.while_loop(lambda *_: tf.constant(True), halve, bounds, maximum_iterations=_BISECTIONS)
    return mean / k * tf.exp(hi)


def gpareto_tail(x, delta):
    """Threshold with tail mass ``delta`` of a generalized Pareto fitted to ``x > 0``."""
    mean = tf.reduce_mean(x)
    ratio = tf.square(mean) / tf.math.reduce_variance(x)
    xi = (1 - ratio) / 2
    sigma = mean * (1 + ratio) / 2
    safe_xi = tf.where(tf.abs(xi) < 1e-8, tf.ones_like(xi), xi)
    return tf.where(tf.abs(xi) < 1e-8, -sigma * math.log(delta), sigma * (delta ** -safe_xi - 1) / safe_xi)


TAILS = {"exponential": exponential_tail, "gamma": gamma_tail, "gpareto": gpareto_tail}


def multistage_threshold(x, delta, stages, family):
    """SIDCo's threshold on magnitudes ``x`` (float64, zeros allowed)."""
    tail = TAILS[family]
    stage_delta = delta ** (1.0 / stages)
    eta = tf.constant(0.0, tf.float64)
    for _ in range(stages):
        beyond = tf.boolean_mask(x, x > eta) - eta
        fitted = tail(beyond, stage_delta)
        fitted = tf.where(tf.math.is_finite(fitted) & (fitted > 0), fitted,
                          exponential_tail(beyond, stage_delta))
        eta = tf.where(tf.size(beyond) > 0, eta + fitted, eta)
    return eta


class SIDCoCompressor(SparseCompressor):
    """Statistical threshold for a target density, from a fitted tail.

    Args:
        delta: target fraction of (nonzero) elements sent, in (0, 1).
        stages: fitting stages, an int in [1, 8].
        family: "exponential", "gamma" or "gpareto".
        **kwargs: see ``SparseCompressor``.
    """

    def __init__(self, delta=0.001, stages=2, family="exponential", **kwargs):
        super().__init__(**kwargs)
        _check("delta", delta, 0.0 < delta < 1.0, "in (0, 1)")
        _check("stages", stages, isinstance(stages, int) and 1 <= stages <= 8, "an int in [1, 8]")
        _check("family", family, family in FAMILIES, f"one of {FAMILIES}")
        self.delta, self.stages, self.family = delta, stages, family

    def select(self, acc, grad, slot):
        magnitude = tf.abs(acc)
        eta = multistage_threshold(tf.cast(magnitude, tf.float64), self.delta, self.stages, self.family)
        indices = tf.cast(tf.where(magnitude > tf.cast(eta, acc.dtype))[:, 0], tf.int32)
        return indices, {"threshold": eta}


def _check(name, value, ok, valid):
    if not ok:
        raise ValueError(f"SIDCoCompressor: {name} must be {valid}, got {value!r}")
