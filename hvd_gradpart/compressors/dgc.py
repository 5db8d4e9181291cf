"""Deep Gradient Compression: momentum correction and masking, a density warm-up, a sampled threshold.

Lin, Han, Mao, Wang, Dally 2018, "Deep Gradient Compression: Reducing the
Communication Bandwidth for Distributed Training" (ICLR, arXiv:1712.01887).
Per element, with momentum ``m`` and fresh gradient ``g``:

* local gradient clipping (optional): ``g`` is clipped to L2 norm
  ``clip_norm / sqrt(N)`` (N ranks) before it is accumulated;
* momentum correction: ``u = m * u + g``, ``v = v + u`` (``v`` is the base's
  residual), and ``v`` is what is sparsified and sent;
* momentum factor masking: ``u`` and ``v`` are zeroed where sent (``v`` by
  error feedback, ``u`` in ``after_send``);
* warm-up: the density falls 25 %, 6.25 %, 1.5625 %, 0.4 % (one stage per
  ``warmup_steps`` steps), then stays at ``density`` (0.1 %);
* sampled threshold: the top-``density`` threshold of a strided sample of
  ``|v|`` selects; if more than ``ceil(density * n)`` pass, exact top-k runs
  on those that passed.

The optimizer must be plain SGD without momentum: momentum is applied here,
before the exchange. Deviations: the paper counts warm-up in epochs, here in
steps (set ``warmup_steps`` to the steps per epoch to match it); clipping is
per tensor, not over the global gradient norm (Horovod hands over one tensor
at a time); the learning-rate warm-up is the training loop's business; the
sample is strided with an offset that moves every step, not random, and the
reference code's threshold-adaptation loop is omitted (exact top-k on the
passing set bounds the count instead); exact zeros are never sent.
"""
import math

import tensorflow as tf

from hvd_gradpart import exchange, fused
from hvd_gradpart.compressors import topk
from hvd_gradpart.compressors.sparse import SparseCompressor

WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004)


class DGCCompressor(SparseCompressor):
    """DGC: momentum correction and masking, warm-up, sampled top-k threshold.

    Args:
        density: fraction sent per tensor after warm-up, in (0, 1].
        momentum: momentum ``m`` of the correction, in [0, 1).
        clip_norm: global gradient-norm threshold, or None (no clipping);
            each rank clips its tensor to ``clip_norm / sqrt(N)``; > 0.
        warmup_steps: steps per warm-up stage (0 disables warm-up); int >= 0.
        warmup_densities: densities of the warm-up stages, each in (0, 1].
        sample_ratio: fraction of elements sampled for the threshold, in (0, 1].
        **kwargs: see ``SparseCompressor``.
    """

    DIAGNOSTICS = ("density", "threshold")

    def __init__(self, density=0.001, momentum=0.9, clip_norm=None, warmup_steps=100,
                 warmup_densities=WARMUP_DENSITIES, sample_ratio=0.01, **kwargs):
        super().__init__(**kwargs)
        _check("density", density, 0.0 < density <= 1.0, "in (0, 1]")
        _check("momentum", momentum, 0.0 <= momentum < 1.0, "in [0, 1)")
        _check("clip_norm", clip_norm, clip_norm is None or clip_norm > 0, "None or > 0")
        _check("warmup_steps", warmup_steps, isinstance(warmup_steps, int) and warmup_steps >= 0,
               "an int >= 0")
        _check("warmup_densities", warmup_densities, all(0.0 < d <= 1.0 for d in warmup_densities),
               "a sequence of values in (0, 1]")
        _check("sample_ratio", sample_ratio, 0.0 < sample_ratio <= 1.0, "in (0, 1]")
        self.density, self.momentum, self.clip_norm = density, momentum, clip_norm
        self.warmup_steps, self.warmup_densities = warmup_steps, tuple(warmup_densities)
        self.sample_ratio = sample_ratio

    def state_spec(self):
        return {"u": lambda n, dtype: tf.zeros([n], dtype),
                "step": lambda n, dtype: tf.constant(0, tf.int64)}

    def density_at(self, step):
        """The density of (0-based, int64) ``step`` under the warm-up schedule."""
        if self.warmup_steps == 0:
            return tf.constant(self.density, tf.float64)
        schedule = tf.constant(self.warmup_densities + (self.density,), tf.float64)
        stage = tf.minimum(step // self.warmup_steps, len(self.warmup_densities))
        return tf.gather(schedule, stage)

    def transform(self, grad):
        if self.clip_norm is None:
            return grad
        limit = self.clip_norm / tf.sqrt(tf.cast(exchange.world_size(), tf.float64))
        return tf.clip_by_norm(grad, tf.cast(limit, grad.dtype))

    def accumulate(self, residual, grad, state):
        u = tf.cast(self.momentum, grad.dtype) * state["u"] + grad
        return residual + u, {"u": u}

    def prepare(self, residual, grad, state, slot):
        n = residual.shape.num_elements()
        step = state["step"]
        density = self.density_at(step)
        s = min(n, max(1, math.ceil(self.sample_ratio * n)))
        stride = n // s
        start = tf.cast(step % stride, tf.int32)
        sample = tf.abs(self.accumulated_at(residual, grad, state, lambda x: x[start::stride][:s]))
        k_sample = tf.cast(tf.math.ceil(density * s), tf.int32)
        return density, tf.reduce_min(tf.math.top_k(sample, k=k_sample, sorted=False).values)

    def mask(self, acc, grad, state, plan):
        magnitude = tf.abs(acc)
        return (magnitude >= plan[1]) & (magnitude > 0)

    def select(self, swept, grad, slot):
        acc, candidates, (density, threshold) = swept.acc, swept.candidates, swept.plan
        k = tf.cast(tf.math.ceil(density * acc.shape.num_elements()), tf.int32)
        capped = lambda: topk.top_among(acc, candidates, k)
        indices = tf.cond(candidates.count > k, capped, lambda: candidates.indices)
        slot.state["step"].assign_add(1)
        return indices, {"density": density, "threshold": threshold}

    def after_send(self, state, indices):
        return {"u": fused.zero_at(state["u"], indices)}


def _check(name, value, ok, valid):
    if not ok:
        raise ValueError(f"DGCCompressor: {name} must be {valid}, got {value!r}")
