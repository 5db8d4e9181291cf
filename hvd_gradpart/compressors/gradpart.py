"""GradPart: adaptive compression by gradient partition and entropy thresholds.

Each step, per gradient (formulas and their derivation in docs/algorithm.md):

1. fit GG(mu, alpha, beta) to the nonzero values of a strided sample of
   the fresh gradient (Gaussian, Laplace or generalized, by likelihood),
   then predict this step's parameters as an EMA over steps;
2. partition: key area where the fresh gradient is beyond the boundary at
   which self-information equals entropy, sparse area elsewhere;
3. per area A of size n_A, send accumulated values with
   ``|a| > exp(h) * log n_A``: beyond the entropy power ``exp(h)`` (the
   width of the distribution's typical set) by a factor equal to the cost,
   in nats, of coding one position in A;
4. keep density within [floor, ceiling]: over the ceiling the largest
   candidates go, under the floor exact top-k of the tensor; everything
   unsent stays in the residual. During the first
   ``warmup_steps`` the floor falls log-linearly from the ceiling to
   ``density_floor`` (a dense start, as DGC's warm-up), so short runs and
   adaptive optimizers are not starved while the predictions settle;
5. follow the link (``hvd_gradpart.budget``): one shared price, in nats,
   joins every area's position cost, so the step sends what pays for itself
   in progress per second on the measured link; when a dense allreduce of
   the gradient makes more progress per second, the step hands Horovod the
   gradient itself.
"""
import math

import tensorflow as tf

from hvd_gradpart import entropy, partition, stats
from hvd_gradpart.compressors import topk
from hvd_gradpart.compressors.linked import LinkAwareCompressor

_SCALAR = lambda value: (lambda n, dtype: tf.constant(value, tf.float64))


class GradPartCompressor(LinkAwareCompressor):
    """Adaptive gradient-partition compressor; no argument needs setting.

    Args:
        sample_size: elements sampled (strided) per fit; bounds its cost.
        prediction_decay: EMA weight of the previous step's parameters.
        margin: nats added to the position cost (a sparser exchange).
        density_floor: least fraction sent per tensor per step.
        density_ceiling: most fraction sent per tensor per step.
        warmup_steps: steps over which the floor falls from the ceiling
            to ``density_floor`` (0, or a floor of 0: no warm-up).
        fit: ablation switch; False fixes the family to Gaussian.
        partition: ablation switch; False uses one area for the tensor.
        entropy: ablation switch; False sends a fixed tail fraction
            ``fixed_density`` of the fitted distribution instead.
        predict: ablation switch; False uses each step's own fit.
        fixed_density: tail fraction used when ``entropy`` is False.
        value_encoding: "fp16" (default: values travel as float16, what
            rounding removes stays in the residual) or "native".
        **kwargs: see ``LinkAwareCompressor`` (``follow_link``: ablation switch) and
            ``SparseCompressor``.
    """

    DIAGNOSTICS = ("family", "mu", "alpha", "beta", "key_size", "tau_key", "tau_sparse")

    def __init__(self, sample_size=4096, prediction_decay=0.9, margin=0.0,
                 density_floor=1e-4, density_ceiling=0.02, warmup_steps=0, fit=True, partition=True,
                 entropy=True, predict=True, fixed_density=1e-3, value_encoding="fp16",
                 **kwargs):
        super().__init__(value_encoding=value_encoding, **kwargs)
        _check("sample_size", sample_size, lambda v: isinstance(v, int) and v >= 16, "an int >= 16")
        _check("prediction_decay", prediction_decay, lambda v: 0.0 <= v < 1.0, "in [0, 1)")
        _check("margin", margin, lambda v: math.isfinite(v) and v >= 0.0, "finite and >= 0")
        _check("density_floor", density_floor, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        _check("density_ceiling", density_ceiling, lambda v: density_floor <= v <= 1.0,
               "in [density_floor, 1]")
        _check("warmup_steps", warmup_steps, lambda v: isinstance(v, int) and v >= 0, "an int >= 0")
        _check("fixed_density", fixed_density, lambda v: 0.0 < v < 1.0, "in (0, 1)")
        self.sample_size = sample_size
        self.prediction_decay = prediction_decay if predict else 0.0
        self.margin = margin
        self.density_floor = density_floor
        self.density_ceiling = density_ceiling
        self.warmup_steps = warmup_steps
        self.use_fit, self.use_partition, self.use_entropy = fit, partition, entropy
        self.fixed_density = fixed_density

    def state_spec(self):
        return {"mu": _SCALAR(0.0), "alpha": _SCALAR(1.0), "beta": _SCALAR(2.0), "steps": _SCALAR(0.0)}

    @tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
    def plan(self, sample, valid, previous, steps, n, price):
        """Predicted fit, key-area size, boundary and thresholds for an
        ``n``-element gradient, from its strided ``sample``: O(sample), one
        compiled call, traced once for every size (the sample's length is fixed
        and ``n`` is a tensor).

        Args:
            sample: strided sample of the fresh gradient (zeros are ignored).
            valid: bool mask of its sampled elements (``stats.fixed_sample``).
            previous: the last prediction (``stats.Fit``).
            steps: how many steps the prediction has seen.
            n: the gradient's size (a float64 scalar tensor).
            price: the link's price of a sent value, nats (float64 scalar).
        """
        nonzero = tf.not_equal(sample, 0) & valid
        current = stats.fit(sample, None if self.use_fit else stats.GAUSSIAN, weights=nonzero)
        fit = stats.predict(previous._replace(family=current.family), current, steps, self.prediction_decay)
        empty = tf.logical_not(tf.reduce_any(nonzero))  # nothing to fit: keep the last prediction
        fit = stats.Fit(*(tf.where(empty, p, f) for p, f in zip(previous[:3], fit[:3])), fit.family)
        if self.use_partition:
            key_size, sparse_size = partition.area_sizes(sample, fit, n, valid)
            edge = partition.boundary(fit)
        else:
            key_size, sparse_size = tf.constant(0.0, tf.float64), n
            edge = tf.constant(float("inf"), tf.float64)
        tau_sparse = self.area_threshold(fit, sparse_size, price)
        tau_key = self.area_threshold(fit, key_size, price) if self.use_partition else tau_sparse
        return fit, key_size, edge, tau_key, tau_sparse

    def area_threshold(self, fit, size, price):
        """One area's threshold: entropy rule (a position's cost plus the link's price), or
        fixed tail when ablated."""
        if not self.use_entropy:
            return entropy.tail_threshold(fit, self.fixed_density)
        return entropy.power_threshold(fit, tf.maximum(entropy.position_cost(size) + self.margin + price, 0.0))

    def prepare(self, residual, grad, state, slot):
        s = slot.state
        previous = stats.Fit(s["mu"].read_value(), s["alpha"].read_value(), s["beta"].read_value(),
                             tf.constant(stats.GAUSSIAN))
        sample, valid = stats.fixed_sample(grad, self.sample_size)
        return self.plan(sample, valid, previous, s["steps"].read_value(),
                         tf.cast(tf.size(grad), tf.float64), slot.price)

    def mask(self, acc, grad, state, plan):
        fit, _, edge, tau_key, tau_sparse = plan
        as_grad = lambda x: tf.cast(x, grad.dtype)
        return partition.select_mask(acc, grad, as_grad(fit.mu), as_grad(edge), as_grad(tau_key),
                                     as_grad(tau_sparse))

    def select(self, swept, grad, slot):
        fit, key_size, _, tau_key, tau_sparse = swept.plan
        s = slot.state
        s["mu"].assign(fit.mu)
        s["alpha"].assign(fit.alpha)
        s["beta"].assign(fit.beta)
        indices = self.guard(swept.acc, swept.candidates, s["steps"].read_value())
        s["steps"].assign_add(tf.constant(1.0, tf.float64))
        return indices, {"family": fit.family, "mu": fit.mu, "alpha": fit.alpha, "beta": fit.beta,
                         "key_size": key_size, "tau_key": tau_key, "tau_sparse": tau_sparse}

    def floor(self, steps):
        """The warm-up's density floor at ``steps`` (float64): log-linear from
        the ceiling to ``density_floor`` over ``warmup_steps``, then that floor."""
        progress = tf.minimum(steps / self.warmup_steps, 1.0)
        return self.density_ceiling * (self.density_floor / self.density_ceiling) ** progress

    def guard(self, acc, candidates, steps):
        """The candidates' indices; over the ceiling the largest of them (``topk.top_among``
        the candidates, no pass over the tensor); under the floor (the warm-up's at
        ``steps`` while it lasts) exact top-k of the whole tensor (``topk.top_k``)."""
        n = tf.cast(tf.size(acc), tf.float64)
        one = tf.constant(1.0, tf.float64)
        low = tf.minimum(n, tf.maximum(one, tf.math.ceil(self.density_floor * n))) if self.density_floor > 0 else 0 * n
        high = tf.maximum(low, tf.floor(self.density_ceiling * n))
        if self.warmup_steps > 0 and self.density_floor > 0:
            low = tf.clip_by_value(tf.math.ceil(self.floor(steps) * n), low, high)
        low, high = tf.cast(low, tf.int32), tf.cast(high, tf.int32)
        count = candidates.count
        capped = lambda: tf.cond(count > high, lambda: topk.top_among(acc, candidates, high),
                                 lambda: candidates.indices)
        return tf.cond(count < low, lambda: topk.top_k(acc, low), capped)


def _check(name, value, ok, valid):
    """Raises ValueError naming ``name`` unless ``value`` is a number passing ``ok``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"GradPartCompressor: {name} must be {valid}, got {value!r}")
