"""Variance-based compression: an element travels once its accumulated update beats its noise.

Tsuzuku, Imachi, Akiba 2018, "Variance-based Gradient Compression for
Efficient Distributed Deep Learning" (arXiv:1802.06058).
Per element, keep the unsent accumulated gradient ``r`` (the base's residual)
and an accumulated variance ``v``; each step ``r += g`` and ``v += s`` (``s``
this step's variance of ``g``); send where ``r**2 > alpha * v`` (the update
is no longer ambiguous), then ``v = 0`` where sent and ``v *= zeta`` elsewhere.

The variance ``s`` comes from one of two sources:

* ``"steps"`` (default, drop-in): Horovod hands ``compress`` only the
  minibatch gradient, so ``s`` is estimated across steps per element as
  ``EMA(g**2) - EMA(g)**2`` (bias-corrected EMAs, clamped at 0). This is an
  approximation: it also counts how ``g`` drifts over steps.
* ``"microbatches"`` (as in the paper): the training loop calls
  ``observe_microbatches`` each step with the gradients of M equal-sized
  micro-batches (per-example gradients when M is the batch size); ``s`` is
  the unbiased variance of their mean, ``sum((g_m - mean)**2) / (M (M - 1))``.

Deviations: values travel as ``value_encoding`` says (native or fp16), not in
the paper's 4-bit quantization, which the shared exchange does not carry;
``alpha = 1`` and ``zeta = 0.999`` are this project's defaults; the
unbiased centred estimator of ``s`` is this project's choice, and the paper's
cheap in-backprop computation of per-example squares is left to the caller.
"""
import math

import tensorflow as tf

from hvd_gradpart import fused
from hvd_gradpart.compressors.sparse import SparseCompressor

SOURCES = ("steps", "microbatches")
_SCALAR = lambda n, dtype: tf.constant(0.0, tf.float64)
_ZEROS = lambda n, dtype: tf.zeros([n], dtype)


class VarianceCompressor(SparseCompressor):
    """Sends elements whose accumulated update beats its accumulated noise.

    Args:
        alpha: send where ``r**2 > alpha * v``; > 0 (larger sends less).
        zeta: decay of ``v`` for unsent elements per step, in (0, 1].
        variance: ``"steps"`` (drop-in estimate over steps) or
            ``"microbatches"`` (from ``observe_microbatches``).
        moment_decay: EMA weight of past steps in the ``"steps"`` estimate,
            in (0, 1).
        **kwargs: see ``SparseCompressor``.
    """

    def __init__(self, alpha=1.0, zeta=0.999, variance="steps", moment_decay=0.99, **kwargs):
        super().__init__(**kwargs)
        _check("alpha", alpha, math.isfinite(alpha) and alpha > 0, "finite and > 0")
        _check("zeta", zeta, 0.0 < zeta <= 1.0, "in (0, 1]")
        _check("variance", variance, variance in SOURCES, f"one of {SOURCES}")
        _check("moment_decay", moment_decay, 0.0 < moment_decay < 1.0, "in (0, 1)")
        self.alpha, self.zeta, self.variance, self.moment_decay = alpha, zeta, variance, moment_decay
        self.observed = []
        self._cursor = 0

    def state_spec(self):
        spec = {"v": _ZEROS}
        if self.variance == "steps":
            spec.update(mean=_ZEROS, square=_ZEROS, steps=_SCALAR)
        return spec

    def observe_microbatches(self, microbatch_grads):
        """Stores the variance of the minibatch-mean gradient for the next step.

        Call once per step, before the gradients reach Horovod (inside the
        same ``tf.function`` as the step, or eagerly before it). The i-th
        gradient this compressor sparsifies next uses the i-th sparsifiable
        gradient given here.

        Args:
            microbatch_grads: a list over M >= 2 equal-sized micro-batches of
                gradient lists, each in the order the tape returns them (the
                order Horovod compresses them); ``None`` entries are skipped.

        Raises:
            ValueError: fewer than two micro-batches, or lists of different lengths.
        """
        m = len(microbatch_grads)
        if m < 2 or len({len(grads) for grads in microbatch_grads}) != 1:
            raise ValueError("observe_microbatches needs >= 2 gradient lists of equal length, "
                             f"got lengths {[len(g) for g in microbatch_grads]}")
        kept = [tf.stack([tf.reshape(g, [-1]) for g in grads])
                for grads in zip(*microbatch_grads) if grads[0] is not None and self.sparsifies(grads[0])]
        for i, stacked in enumerate(kept):
            centred = stacked - tf.reduce_mean(stacked, 0)
            variance = tf.reduce_sum(tf.square(centred), 0) / (m * (m - 1))
            if i == len(self.observed):
                with tf.init_scope():
                    self.observed.append(tf.Variable(tf.zeros(variance.shape, variance.dtype),
                                                     trainable=False, name=f"observed_variance_{i}"))
            self.observed[i].assign(variance)
        self._cursor = 0

    def inputs(self, slot, grad):
        state = super().inputs(slot, grad)
        if self.variance == "microbatches":
            state["observed"] = self._next_observed(grad)
        return state

    def accumulate(self, residual, grad, state):
        if self.variance == "microbatches":
            next_state = {"v": state["v"] + state["observed"]}
        else:
            next_state = self._moments(grad, state)
        return residual + grad, next_state

    def _moments(self, grad, state):
        """The ``"steps"`` estimate of ``s`` added to ``v``, with the EMAs it updates."""
        b = tf.cast(self.moment_decay, grad.dtype)
        steps = state["steps"] + 1
        mean = b * state["mean"] + (1 - b) * grad
        square = b * state["square"] + (1 - b) * tf.square(grad)
        correction = tf.cast(1 - tf.pow(tf.constant(self.moment_decay, tf.float64), steps), grad.dtype)
        s = tf.maximum(square / correction - tf.square(mean / correction), 0)
        return {"v": state["v"] + s, "steps": steps, "mean": mean, "square": square}

    def _next_observed(self, grad):
        i = self._cursor
        if i >= len(self.observed):
            raise ValueError(f"VarianceCompressor(variance='microbatches'): gradient #{i} has no observed "
                             "variance; call observe_microbatches before each step")
        observed = self.observed[i]
        if observed.shape != grad.shape or observed.dtype != grad.dtype:
            raise ValueError(f"VarianceCompressor: observed variance #{i} is {observed.dtype.name}"
                             f"{observed.shape}, but gradient #{i} is {grad.dtype.name}{grad.shape}; "
                             "pass the gradients in the order Horovod receives them")
        self._cursor += 1
        return observed.read_value()

    def mask(self, acc, grad, state, plan):
        return tf.square(acc) > tf.cast(self.alpha, acc.dtype) * state["v"]

    def select(self, swept, grad, slot):
        return swept.candidates.indices, {}

    def after_send(self, state, indices):
        return {**state, "v": fused.zero_at(state["v"] * tf.cast(self.zeta, state["v"].dtype), indices)}


def _check(name, value, ok, valid):
    if not ok:
        raise ValueError(f"VarianceCompressor: {name} must be {valid}, got {value!r}")
