"""Distribution fitting and prediction for gradient values.

The family is the generalized Gaussian GG(mu, alpha, beta), density
``beta / (2 alpha Gamma(1/beta)) * exp(-(|x - mu| / alpha) ** beta)``:
beta = 2 is Gaussian, beta = 1 Laplace, beta < 1 heavier tails. Everything
is computed from a bounded strided sample, so a fit costs O(sample).
"""
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from scipy.special import gammaln

GAUSSIAN, LAPLACE, GENERALIZED = 0, 1, 2
FAMILIES = ("gaussian", "laplace", "generalized")
BETA_MIN, BETA_MAX = 0.1, 4.0
_TINY = 1e-30

_BETA_GRID = np.exp(np.linspace(np.log(BETA_MIN), np.log(BETA_MAX), 512))
# rho(beta) = (E|x-mu|)^2 / E(x-mu)^2 for GG; increasing in beta (2/pi at beta = 2).
_RHO_GRID = np.exp(2 * gammaln(2 / _BETA_GRID) - gammaln(1 / _BETA_GRID) - gammaln(3 / _BETA_GRID))


class Fit(NamedTuple):
    """Parameters of a fitted GG distribution (float64 scalars)."""

    mu: tf.Tensor
    alpha: tf.Tensor
    beta: tf.Tensor
    family: tf.Tensor


def strided_sample(x, size):
    """At most ``size`` evenly strided elements of flat ``x`` (O(size); ``x``'s length may be
    known only as the graph runs)."""
    n = x.shape.num_elements()
    stride = max(1, -(-n // size)) if n is not None else tf.maximum(1, (tf.size(x) + size - 1) // size)
    return x[::stride][:size]


def fixed_sample(x, size):
    """``strided_sample`` zero-padded to exactly ``size`` elements, and a bool mask of the sampled
    ones: every tensor size gives the same shape, so what takes the sample compiles once."""
    sample = strided_sample(x, size)
    taken = tf.size(sample)
    return tf.reshape(tf.pad(sample, [[0, size - taken]]), [size]), tf.range(size) < taken


def beta_from_ratio(rho):
    """Inverts rho(beta) on a precomputed grid (linear interpolation)."""
    grid = tf.constant(_RHO_GRID, tf.float64)
    betas = tf.constant(_BETA_GRID, tf.float64)
    rho = tf.clip_by_value(rho, grid[0], grid[-1])
    below = tf.reduce_sum(tf.cast(grid < rho, tf.int32))  # searchsorted, in a form XLA compiles
    hi = tf.clip_by_value(below, 1, len(_RHO_GRID) - 1)
    lo = hi - 1
    w = (rho - tf.gather(grid, lo)) / (tf.gather(grid, hi) - tf.gather(grid, lo))
    return tf.gather(betas, lo) + w * (tf.gather(betas, hi) - tf.gather(betas, lo))


def scale_mle(centered_abs, beta, mean=tf.reduce_mean):
    """Maximum-likelihood alpha for a given beta: (beta * mean|x|^beta)^(1/beta)."""
    return tf.maximum((beta * mean(centered_abs ** beta)) ** (1 / beta), _TINY)


def mean_log_likelihood(alpha, beta):
    """Mean log-likelihood of a sample at its own MLE scale ``alpha``."""
    return tf.math.log(beta) - tf.math.log(2 * alpha) - tf.math.lgamma(1 / beta) - 1 / beta


def fit(sample, fixed_family=None, weights=None):
    """Fits Gaussian, Laplace and GG to ``sample``; keeps the likeliest.

    The GG's extra shape parameter pays a BIC penalty of
    ``log(len(sample)) / (2 len(sample))`` per element.

    Args:
        sample: 1-D tensor of values.
        fixed_family: one of GAUSSIAN, LAPLACE, GENERALIZED to skip the
            comparison (the "no fit" ablation fixes GAUSSIAN).
        weights: optional 0/1 weight per value (a static-shape mask, so the
            fit compiles with XLA); all ones by default.
    """
    x = tf.cast(sample, tf.float64)
    w = tf.ones_like(x) if weights is None else tf.cast(weights, tf.float64)
    size = tf.reduce_sum(w)
    mean = lambda v: tf.math.divide_no_nan(tf.reduce_sum(w * v), size)
    mu = mean(x)
    a = tf.abs(x - mu)
    m1, m2 = mean(a), mean(a * a)
    rho = tf.math.divide_no_nan(m1 * m1, m2)
    betas = tf.stack([tf.constant(2.0, tf.float64), tf.constant(1.0, tf.float64), beta_from_ratio(rho)])
    alphas = tf.stack([scale_mle(a, betas[i], mean) for i in range(3)])
    penalty = tf.stack([0.0, 0.0, tf.math.divide_no_nan(tf.math.log(tf.maximum(size, 1.0)), 2 * size)])
    scores = mean_log_likelihood(alphas, betas) - tf.cast(penalty, tf.float64)
    family = tf.argmax(scores, output_type=tf.int32) if fixed_family is None else tf.constant(fixed_family)
    return Fit(mu, tf.gather(alphas, family), tf.gather(betas, family), family)


def log_sigma_over_alpha(beta):
    """``log(sigma / alpha)`` of GG: ``(lgamma(3/beta) - lgamma(1/beta)) / 2``."""
    return (tf.math.lgamma(3 / beta) - tf.math.lgamma(1 / beta)) / 2


def predict(previous, current, steps_seen, decay):
    """Carries parameters across steps: EMA of (mu, log sigma, beta).

    The standard deviation, not alpha, is blended: alpha's meaning changes with
    beta, sigma's does not. alpha is then recomputed from the blended pair.
    The first step (``steps_seen == 0``) takes the current fit as it is.
    """
    if decay == 0.0:
        return current
    w = tf.where(steps_seen > 0, tf.constant(decay, tf.float64), tf.constant(0.0, tf.float64))
    blend = lambda p, c: w * p + (1 - w) * c
    log_sigma = lambda f: tf.math.log(f.alpha) + log_sigma_over_alpha(f.beta)
    beta = blend(previous.beta, current.beta)
    alpha = tf.exp(blend(log_sigma(previous), log_sigma(current)) - log_sigma_over_alpha(beta))
    return Fit(blend(previous.mu, current.mu), alpha, beta, current.family)
