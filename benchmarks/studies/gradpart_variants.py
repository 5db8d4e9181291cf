"""GradPart redesigns tried with ``benchmarks.simulate`` and not adopted (figures in
``results/simulate/summary.md``); kept so those runs can be repeated:

    python -m benchmarks.simulate lenet5 cond=benchmarks.studies.gradpart_variants:Cond --seeds 0

``Cond``: each area's threshold from the fitted GG conditioned on that area, ``exp(h_A) log n_A``.
``Follow``: the prediction takes the fresh fit's scale whenever it is below the EMA's.
``CodeCost``: position cost ``1 + log(n_A / k_A)`` nats, ``k_A`` the area's count sent last step.
``KeyFavor``: the key-area threshold times the key area's share of the tensor.
``KeyFresh``: the key-area threshold at most the fresh rule ``alpha (1/beta + log n_key)^(1/beta)``.
``Half``: both thresholds halved.
``Momentum``: DGC's momentum correction and factor masking inside GradPart (optimizer without
momentum), the fit taken on the corrected velocity.

Against the falls of the first epochs under the optimizer's momentum (docs/notes/gradpart.md,
"The accuracy dips of the first epochs"), each also on Top-k (``TopK...``, with ``ratio=``), run
with ``optimizer_momentum=0`` to see the variant alone:
``Agree``: a value is a candidate only where the fresh gradient has its sign.
``Clip1``, ``Clip3``: a sent value clipped to 1 or 3 times the fresh gradient's largest
magnitude; the excess stays in the residual.
"""
import tensorflow as tf

from hvd_gradpart import entropy, exchange, fused, metrics, partition, stats
from hvd_gradpart.compressors.base import elements
from hvd_gradpart.compressors.gradpart import GradPartCompressor, Prediction
from hvd_gradpart.compressors.topk import TopKCompressor, _top

_PLAN = GradPartCompressor.plan.python_function


def conditional_powers(fit):
    """``exp(h_K), exp(h_S)``: entropy powers of GG(mu, alpha, beta) conditioned on the key area
    ``|x - mu| > alpha (1/beta)^(1/beta)`` and on the sparse area inside it.

    With ``k = 1/beta``, ``u = (edge/alpha)^beta = k`` and ``Y = (|X - mu|/alpha)^beta ~ Gamma(k)``:
    ``h_K = log(2 alpha Gamma(k) / beta) + k Q(k+1, u) / Q(k, u) + log Q(k, u)``, and the same with
    the lower regularized gamma P for the sparse area (``E[Y | Y > u] = k Q(k+1, u) / Q(k, u)``).
    """
    k = 1 / fit.beta
    base = tf.math.log(2 * fit.alpha) + tf.math.lgamma(k) - tf.math.log(fit.beta)
    h_key = base + k * tf.math.igammac(k + 1, k) / tf.math.igammac(k, k) + tf.math.log(tf.math.igammac(k, k))
    h_sparse = base + k * tf.math.igamma(k + 1, k) / tf.math.igamma(k, k) + tf.math.log(tf.math.igamma(k, k))
    return tf.exp(h_key), tf.exp(h_sparse)


class Cond(GradPartCompressor):
    """Per-area conditional entropy power times the area's position cost."""

    @tf.function(jit_compile=True)
    def plan(self, sample, valid, previous, steps, n, price):
        fit, key_size, edge, _, _ = _PLAN(self, sample, valid, previous, steps, n, price)
        power_key, power_sparse = conditional_powers(fit)
        return (fit, key_size, edge, power_key * entropy.position_cost(key_size),
                power_sparse * entropy.position_cost(n - key_size))


class Follow(GradPartCompressor):
    """The predicted scale never lags a falling one: min(EMA, fresh) of log sigma."""

    @tf.function(jit_compile=True)
    def plan(self, sample, valid, previous, steps, n, price):
        nonzero = tf.not_equal(sample, 0) & valid
        current = stats.fit(sample, weights=nonzero)
        fit = stats.predict(previous._replace(family=current.family), current, steps, self.research.decay)
        log_sigma = lambda f: tf.math.log(f.alpha) + stats.log_sigma_over_alpha(f.beta)
        fresh_alpha = tf.exp(log_sigma(current) - stats.log_sigma_over_alpha(fit.beta))
        alpha = tf.where(log_sigma(current) < log_sigma(fit), fresh_alpha, fit.alpha)
        fit = stats.Fit(fit.mu, alpha, fit.beta, fit.family)
        empty = tf.logical_not(tf.reduce_any(nonzero))
        fit = stats.Fit(*(tf.where(empty, p, f) for p, f in zip(previous[:3], fit[:3])), fit.family)
        key_size, sparse_size = partition.area_sizes(sample, fit, n, valid)
        return (fit, key_size, partition.boundary(fit), self.area_threshold(fit, key_size, price),
                self.area_threshold(fit, sparse_size, price))


class CodeCost(GradPartCompressor):
    """Position cost of an actual code for k of n_A positions, per element: 1 + log(n_A / k)."""

    def state_spec(self):
        zero = lambda n, dtype: tf.constant(0.0, tf.float64)
        return {**super().state_spec(), "sent_key": zero, "sent_sparse": zero}

    @tf.function(jit_compile=True)
    def plan_with_counts(self, sample, valid, previous, steps, n, sent_key, sent_sparse):
        fit, key_size, edge, _, _ = _PLAN(self, sample, valid, previous, steps, n, tf.constant(0.0, tf.float64))
        cost = lambda size, k: 1 + tf.math.log(tf.maximum(tf.cast(size, tf.float64), 1.0) / tf.maximum(k, 1.0))
        power = tf.exp(entropy.entropy(fit))
        return fit, key_size, edge, power * cost(key_size, sent_key), power * cost(n - key_size, sent_sparse)

    def prepare(self, residual, grad, state, slot):
        s = slot.state
        previous = Prediction.of(s["prediction"].read_value())
        return self.plan_with_counts(
            *stats.fixed_sample(grad, self.research.sample_size), previous.fit(), previous.steps,
            grad.shape.num_elements(), s["sent_key"].read_value(), s["sent_sparse"].read_value())

    def select(self, swept, grad, slot):
        indices, diagnostics = super().select(swept, grad, slot)
        fit, _, edge = swept.plan[:3]
        as_grad = lambda x: tf.cast(x, grad.dtype)
        in_key = tf.gather(tf.abs(grad - as_grad(fit.mu)) > as_grad(edge), indices)
        sent_key = tf.reduce_sum(tf.cast(in_key, tf.float64))
        s = slot.state
        s["sent_key"].assign(sent_key)
        s["sent_sparse"].assign(tf.cast(tf.size(indices), tf.float64) - sent_key)
        return indices, diagnostics


class KeyFavor(GradPartCompressor):
    """The key-area threshold times the key share ``n_key / n`` (about 0.2 to 0.45)."""

    @tf.function(jit_compile=True)
    def plan(self, sample, valid, previous, steps, n, price):
        fit, key_size, edge, tau_key, tau_sparse = _PLAN(self, sample, valid, previous, steps, n, price)
        return fit, key_size, edge, tau_key * tf.cast(key_size, tf.float64) / n, tau_sparse


class KeyFresh(GradPartCompressor):
    """The key-area threshold lowered to the fresh rule ``alpha (1/beta + log n_key)^(1/beta)``
    where that is below the entropy power rule (heavy tails, beta under about 1)."""

    @tf.function(jit_compile=True)
    def plan(self, sample, valid, previous, steps, n, price):
        fit, key_size, edge, tau_key, tau_sparse = _PLAN(self, sample, valid, previous, steps, n, price)
        fresh = entropy.threshold(fit, entropy.position_cost(key_size))
        return fit, key_size, edge, tf.minimum(tau_key, fresh), tau_sparse


class Half(GradPartCompressor):
    """Both thresholds halved: the same rule at a denser operating point."""

    @tf.function(jit_compile=True)
    def plan(self, sample, valid, previous, steps, n, price):
        fit, key_size, edge, tau_key, tau_sparse = _PLAN(self, sample, valid, previous, steps, n, price)
        return fit, key_size, edge, tau_key / 2, tau_sparse / 2


class Momentum(GradPartCompressor):
    """Momentum applied before the exchange, as DGC does: ``u = m u + g``, ``a = r + u``, ``u``
    zeroed where sent; the fit sees ``m u + g`` (what accumulates). The optimizer must run
    without momentum (``benchmarks.simulate`` does so for a compressor with a ``momentum``)."""

    def __init__(self, momentum=0.9, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum

    def state_spec(self):
        return {**super().state_spec(), "u": lambda n, dtype: tf.zeros([n], dtype)}

    def velocity(self, grad, state):
        return tf.cast(self.momentum, grad.dtype) * state["u"] + grad

    def accumulate(self, residual, grad, state):
        u = self.velocity(grad, state)
        return residual + u, {"u": u}

    def prepare(self, residual, grad, state, slot):
        return super().prepare(residual, self.velocity(grad, state), state, slot)

    def after_send(self, state, indices):
        return {"u": fused.zero_at(state["u"], indices)}


class Agree(GradPartCompressor):
    """Candidates only where the accumulated value and the fresh gradient share their sign."""

    def mask(self, acc, grad, state, plan):
        return super().mask(acc, grad, state, plan) & (acc * grad > 0)


class TopKAgree(TopKCompressor):
    """Top-k among the values whose fresh gradient shares their sign (over the whole tensor)."""

    def select(self, swept, grad, slot):
        agreeing = tf.where(swept.acc * grad > 0, swept.acc, tf.zeros_like(swept.acc))
        return _top(agreeing, self.k(swept.acc.shape.num_elements())), {}


def clipped(cls, factor):
    """``cls`` whose sent values are clipped to ``factor`` times the fresh gradient's largest
    magnitude (the shared ``_send`` with one line added); the excess stays in the residual."""

    class Clipped(cls):
        def _send(self, view, grad, swept, header, opens_group):
            n = elements(grad)
            indices, diagnostics = self.select(swept, grad, view)
            bound = factor * tf.reduce_max(tf.abs(grad))
            values = tf.clip_by_value(tf.gather(swept.acc, indices), -bound, bound)
            encoded = exchange.encode(values, indices, n, self.value_encoding, header, ascending=True)
            residual = self._store(view, swept, indices, encoded.sent)
            sent = exchange.sent_bytes(encoded.payload, opens_group)
            metrics.record(view.metrics, elements=n, dense_bytes=n * grad.dtype.size,
                           sent_elements=tf.size(indices), sent_bytes=sent, wire_format=encoded.format,
                           **diagnostics)
            as64 = lambda x: tf.cast(x, tf.float64)
            least = tf.reduce_min(tf.square(as64(values)))
            counts = tf.stack([as64(sent), as64(tf.size(indices)), as64(swept.candidates.count),
                               as64(swept.energy), least])
            return encoded.payload, counts, residual

    Clipped.__name__ = f"{cls.__name__}Clip{factor:g}"
    return Clipped


Clip1, Clip3 = clipped(GradPartCompressor, 1.0), clipped(GradPartCompressor, 3.0)
TopKClip1, TopKClip3 = clipped(TopKCompressor, 1.0), clipped(TopKCompressor, 3.0)
