"""Information-entropy thresholds for a fitted GG(mu, alpha, beta).

Self-information of a value x is ``I(x) = -log f(x)``; the distribution's
differential entropy is ``h = E[I(X)] = 1/beta + log(2 alpha Gamma(1/beta) / beta)``.
Their difference does not depend on the scale::

    I(x) - h = (|x - mu| / alpha) ** beta - 1 / beta

An element is worth sending when its value carries more information than a
typical one by at least the cost of coding its position (``cost`` nats), i.e.
when ``|x - mu| > alpha * (1/beta + cost) ** (1/beta)``.
"""
import tensorflow as tf


def _f64(x):
    """``x`` as a float64 tensor, without a float32 detour for Python floats."""
    return tf.cast(x, tf.float64) if tf.is_tensor(x) else tf.constant(x, tf.float64)


def entropy(fit):
    """Differential entropy (nats) of the fitted distribution."""
    b = fit.beta
    return 1 / b + tf.math.log(2 * fit.alpha) + tf.math.lgamma(1 / b) - tf.math.log(b)


def excess_information(x, fit):
    """``I(x) - h`` for each value of ``x`` (nats)."""
    z = tf.abs(tf.cast(x, tf.float64) - fit.mu) / fit.alpha
    return z ** fit.beta - 1 / fit.beta


def threshold(fit, cost):
    """Magnitude above which ``I(x) - h`` exceeds ``cost`` nats."""
    return fit.alpha * (1 / fit.beta + _f64(cost)) ** (1 / fit.beta)


def power_threshold(fit, cost):
    """``exp(h) * cost``: the entropy power (width of the typical set) times ``cost``."""
    return tf.exp(entropy(fit)) * _f64(cost)


def position_cost(count):
    """Nats to name one position among ``count`` equally likely ones."""
    return tf.math.log(tf.maximum(tf.cast(count, tf.float64), 1.0))


def tail_threshold(fit, tail, iterations=60):
    """Magnitude t with P(|X - mu| > t) = ``tail`` (bisection on log t).

    Used by the fixed-quantile ablation, which replaces the entropy rule.
    """
    shape = 1 / fit.beta
    tail_at = lambda log_t: tf.math.igammac(shape, tf.exp(log_t - tf.math.log(fit.alpha)) ** fit.beta)
    # (t/alpha)^beta of the tail point stays below -log(tail) + 20/beta + 50 for beta >= 0.1.
    lo = tf.math.log(fit.alpha) - tf.constant(20.0, tf.float64)
    hi = tf.math.log(fit.alpha) + tf.math.log(-tf.math.log(_f64(tail)) + 20 / fit.beta + 50) / fit.beta

    def body(lo, hi):
        mid = (lo + hi) / 2
        above = tail_at(mid) > tail
        return tf.where(above, mid, lo), tf.where(above, hi, mid)

    lo, hi = tf.while_loop(lambda lo, hi: True, body, (lo, hi), maximum_iterations=iterations)
    return tf.exp((lo + hi) / 2)
