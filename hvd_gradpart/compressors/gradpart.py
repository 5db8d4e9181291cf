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
   in nats, of coding one position in A (following the link, a position
   is named among the whole step's N elements: ``log (n_A N / n)``, so a
   small tensor's values are not cheaper to send than a large one's);
4. keep density within [floor, ceiling]: over the ceiling the largest
   candidates go, under the floor exact top-k of the tensor; everything
   unsent stays in the residual. During the first ``warmup_steps`` (a
   research setting, off by default: ``GradPartResearch``) the floor falls
   log-linearly from the ceiling to ``density_floor`` (a dense start, as
   DGC's warm-up), so short runs and adaptive optimizers are not starved
   while the predictions settle;
5. spectral key area (``hvd_gradpart.spectral``; a research setting, off
   by default): a matrix-shaped gradient also sends its leading directions
   as warm factors through the allreduce, as many as pay against the
   coordinates' energy per byte and the link's price; the steps above then
   pick the outliers of what the factors leave;
6. follow the link (``hvd_gradpart.budget``): one shared price, in nats,
   joins every area's position cost, so the values sent cost the share of
   the step (link and CPU time, measured) that makes time to accuracy least;
   when a dense allreduce of the gradient makes more progress per second,
   the step hands Horovod the gradient itself;
7. hand each decoded sum to a momentum optimizer so that it applies it once
   (``hvd_gradpart.momentum``): error feedback's bursts are not repeated by
   the optimizer's momentum.
"""
from typing import NamedTuple

import tensorflow as tf

from hvd_gradpart import entropy, exchange, fused, metrics, partition, spectral, stats
from hvd_gradpart.compressors import batch as batch_step, topk
from hvd_gradpart.compressors.linked import LinkAwareCompressor
from hvd_gradpart.compressors.research import GradPartResearch
from hvd_gradpart.memory import creating_slot_variables

_BUCKET_SHIFT = 20  # a float32 magnitude's bits over this: exponent and 3 mantissa bits
_BUCKETS = 1 << (31 - _BUCKET_SHIFT)


class Prediction(NamedTuple):
    """A gradient's GradPart state: one float64 ``[4]`` variable, ``prediction``, in this order."""

    mu: tf.Tensor     # the predicted fit's location ...
    alpha: tf.Tensor  # ... scale ...
    beta: tf.Tensor   # ... and shape (``stats.Fit``)
    steps: tf.Tensor  # the steps the prediction has seen

    @classmethod
    def of(cls, values):
        """The record of a ``[..., 4]`` tensor (the variable's value, or several stacked)."""
        return cls(*tf.unstack(values, axis=-1))

    def fit(self):
        """The predicted ``stats.Fit`` (the family is chosen afresh each step)."""
        return stats.Fit(self.mu, self.alpha, self.beta, tf.zeros_like(self.mu, tf.int32) + stats.GAUSSIAN)


_START = Prediction(0.0, 1.0, 2.0, 0.0)  # a Gaussian of unit scale, no step seen
_HOOKS = ("transform", "accumulate", "prepare", "plan", "mask", "select", "guard", "after_send", "inputs")


class GradPartCompressor(LinkAwareCompressor):
    """Adaptive gradient-partition compressor; no argument needs setting.

    The rule decides what is worth sending from the gradient's own fitted distribution;
    the arguments bound what a step may cost and say how values travel.

    Args:
        density_ceiling: the most a tensor sends per step, as a fraction of its elements,
            in [``research.density_floor``, 1]. Bounds a step's bytes where the rule would
            send more (a flat or piled-up gradient); the largest candidates go.
        follow_link: True prices every sent value in the measured link's time and hands
            Horovod the dense gradient when that makes more progress per second; False
            keeps every step sparse at the rule's own density (a study of the rule alone).
        value_encoding: "fp16" sends values as float16 (what rounding removes stays in the
            residual); "native" in the gradient's dtype.
        min_elements: tensors with fewer elements go uncompressed (compressing them saves
            nothing), an int >= 0.
        optimizer_momentum: the momentum of the SGD optimizer that applies the sums, so that
            it applies each sum once (``hvd_gradpart.momentum``). None (the default) reads it
            from the Keras optimizer under ``hvd.DistributedOptimizer``; with
            ``hvd.DistributedGradientTape`` pass it (0 for Adam or SGD without momentum).
        research: ``GradPartResearch``: the knobs and ablation switches of studies; its
            defaults are the tested ones.
    """

    DIAGNOSTICS = ("family", "mu", "alpha", "beta", "key_size", "tau_key", "tau_sparse")
    RESEARCH = GradPartResearch

    def __init__(self, density_ceiling=0.02, follow_link=True, value_encoding="fp16", min_elements=1024,
                 optimizer_momentum=None, research=GradPartResearch()):
        super().__init__(follow_link=follow_link, value_encoding=value_encoding, min_elements=min_elements,
                         optimizer_momentum=optimizer_momentum)
        if not isinstance(research, GradPartResearch):
            raise TypeError(f"GradPartCompressor: research must be a GradPartResearch, got {research!r}")
        floor = research.density_floor
        if isinstance(density_ceiling, bool) or not isinstance(density_ceiling, (int, float)) or not (
                floor <= density_ceiling <= 1.0):
            raise ValueError(f"GradPartCompressor: density_ceiling must be in [research.density_floor "
                             f"({floor!r}), 1], got {density_ceiling!r}")
        self.density_ceiling = density_ceiling
        self.research = research
        self.keys = {}  # slot key -> spectral.SpectralKey of a matrix-shaped gradient

    def state_spec(self):
        return {"prediction": lambda n, dtype: tf.constant(_START, tf.float64)}

    def figure_names(self):
        return super().figure_names() + (("key_bytes", "rank") if self.research.spectral else ())

    def sums_in_compress(self):
        return self.research.spectral

    def spectral_key(self, slot, tensor):
        """The ``spectral.SpectralKey`` of ``slot``'s float32 matrix-shaped gradient, made on first
        use; None for any other (or with ``research.spectral`` off)."""
        shape = spectral.matrix_shape(tensor.shape, self.research.max_rank)
        if not self.research.spectral or tensor.dtype != tf.float32 or shape is None:
            return None
        if slot.key not in self.keys:
            with tf.init_scope(), creating_slot_variables():
                value_bytes = exchange.wire_dtype(tf.float32, self.value_encoding).size
                self.keys[slot.key] = spectral.SpectralKey(*shape, self.research.max_rank, value_bytes, seed=0)
        return self.keys[slot.key]

    def split(self, slot, tensor, grad):
        key = self.spectral_key(slot, tensor)
        if key is None:
            return None
        residual = slot.residual.value()
        return key.split(grad, residual, residual + grad, self.least_sent(slot), self.research.outliers)

    def after_split(self, slot, split):
        if split is None:
            return
        key = self.keys[slot.key]
        sent = key.sent_bytes(split.width)
        values = tf.cast(split.width * (key.fan_in + key.out), tf.float64)
        metrics.amend(slot.metrics.figures, put={"key_bytes": sent, "rank": tf.cast(split.width, tf.float64)},
                      add={"sent_bytes": sent, "total_sent_bytes": sent, "sent_elements": values,
                           "total_sent_elements": values})

    def slot_view(self, slot, grad, split=None):
        view = super().slot_view(slot, grad, split)
        if split is None:
            return view
        return view._replace(quiet=None if self.research.outliers else split.width > 0)

    @tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
    def plan(self, sample, valid, previous, steps, n, price):
        """``planned`` as one compiled call, traced once for every size (the sample's length is
        fixed and ``n`` is a tensor)."""
        return self.planned(sample, valid, previous, steps, n, price)

    @tf.function(jit_compile=True, autograph=False)
    def _plan_each(self, samples, valid, previous, steps, n, price):
        """``planned`` of each row of ``[T, ...]`` arguments, in one compiled call."""
        return tf.vectorized_map(lambda args: self.planned(*args), (samples, valid, previous, steps, n, price))

    def batch_state(self, states):
        """The ``Prediction`` of every gradient of a batch (``[T]`` tensors) from their method
        states (``{name: variable}``), read once."""
        return Prediction.of(tf.stack([state["prediction"].read_value() for state in states]))

    def plan_all(self, samples, valid, state, n, price):
        """``planned`` of every gradient of a batch (``batch.sparse_step``): ``samples`` and
        ``valid`` ``[T, sample_size]``, ``state`` their ``batch_state``, ``n`` and ``price``
        float64 ``[T]``; a nest of ``[T]`` tensors."""
        return self._plan_each(samples, valid, state.fit(), state.steps, n, price)

    def stored_plan(self, plan, states, state):
        """Stores each fit of a batch's ``plan`` in its method state and counts the step; returns
        the diagnostics (``DIAGNOSTICS``: ``[T]`` tensors)."""
        fit, key_size, _, tau_key, tau_sparse = plan
        rows = tf.stack(Prediction(fit.mu, fit.alpha, fit.beta, state.steps + 1), axis=1)
        for i, variables in enumerate(states):
            variables["prediction"].assign(rows[i], read_value=False)
        return {"family": fit.family, "mu": fit.mu, "alpha": fit.alpha, "beta": fit.beta,
                "key_size": key_size, "tau_key": tau_key, "tau_sparse": tau_sparse}

    def planned(self, sample, valid, previous, steps, n, price):
        """Predicted fit, key-area size, boundary and thresholds for an
        ``n``-element gradient, from its strided ``sample``: O(sample).

        Args:
            sample: strided sample of the fresh gradient (zeros are ignored).
            valid: bool mask of its sampled elements (``stats.fixed_sample``).
            previous: the last prediction (``stats.Fit``).
            steps: how many steps the prediction has seen.
            n: the gradient's size (a float64 scalar tensor).
            price: the link's price of a sent value, nats (float64 scalar).
        """
        nonzero = tf.not_equal(sample, 0) & valid
        current = stats.fit(sample, None if self.research.fit else stats.GAUSSIAN, weights=nonzero)
        fit = stats.predict(previous._replace(family=current.family), current, steps, self.research.decay)
        empty = tf.logical_not(tf.reduce_any(nonzero))  # nothing to fit: keep the last prediction
        fit = stats.Fit(*(tf.where(empty, p, f) for p, f in zip(previous[:3], fit[:3])), fit.family)
        if self.research.partition:
            key_size, sparse_size = partition.area_sizes(sample, fit, n, valid)
            edge = partition.boundary(fit)
        else:
            key_size, sparse_size = tf.constant(0.0, tf.float64), n
            edge = tf.constant(float("inf"), tf.float64)
        tau_sparse = self.area_threshold(fit, sparse_size, price)
        tau_key = self.area_threshold(fit, key_size, price) if self.research.partition else tau_sparse
        return fit, key_size, edge, tau_key, tau_sparse

    def area_threshold(self, fit, size, price):
        """One area's threshold: entropy rule (a position's cost plus the link's price), or
        fixed tail when ablated."""
        if not self.research.entropy:
            return entropy.tail_threshold(fit, self.research.fixed_density)
        cost = entropy.position_cost(size) + self.research.margin + price
        return entropy.power_threshold(fit, tf.maximum(cost, 0.0))

    def prepare(self, residual, grad, state, slot):
        previous = Prediction.of(slot.state["prediction"].read_value())
        sample, valid = stats.fixed_sample(grad, self.research.sample_size)
        return self.plan(sample, valid, previous.fit(), previous.steps, tf.cast(tf.size(grad), tf.float64),
                         slot.price)

    def mask(self, acc, grad, state, plan):
        fit, _, edge, tau_key, tau_sparse = plan
        as_grad = lambda x: tf.cast(x, grad.dtype)
        return partition.select_mask(acc, grad, as_grad(fit.mu), as_grad(edge), as_grad(tau_key),
                                     as_grad(tau_sparse))

    def select(self, swept, grad, slot):
        fit, key_size, _, tau_key, tau_sparse = swept.plan
        prediction = slot.state["prediction"]
        steps = Prediction.of(prediction.read_value()).steps
        indices = self.guard(swept.acc, swept.candidates, steps)
        prediction.assign(tf.stack(Prediction(fit.mu, fit.alpha, fit.beta, steps + 1)), read_value=False)
        return indices, {"family": fit.family, "mu": fit.mu, "alpha": fit.alpha, "beta": fit.beta,
                         "key_size": key_size, "tau_key": tau_key, "tau_sparse": tau_sparse}

    def floor(self, steps):
        """The warm-up's density floor at ``steps`` (float64): log-linear from
        the ceiling to ``density_floor`` over ``warmup_steps``, then that floor."""
        progress = tf.minimum(steps / self.research.warmup_steps, 1.0)
        return self.density_ceiling * (self.research.density_floor / self.density_ceiling) ** progress

    def batches(self, tensor):
        """Whether ``tensor`` joins its group's ``batch.Batch``: traced, float32, no spectral key
        area, and the step is GradPart's own (a subclass that changes a per-gradient hook keeps
        the per-gradient step)."""
        if any(getattr(type(self), hook) is not getattr(GradPartCompressor, hook) for hook in _HOOKS):
            return False
        matrix = self.research.spectral and spectral.matrix_shape(tensor.shape, self.research.max_rank) is not None
        return not tf.executing_eagerly() and tensor.dtype == exchange.MARKER_DTYPE and not matrix

    @tf.function(jit_compile=True, autograph=False)
    def batch_sweep(self, residual, grad, plan, owners):
        """``_sweep`` of a batch's flat buffer, each element against its own gradient's plan
        (``owners``: ``batch.Layout.owners``)."""
        fit, key_size, edge, tau_key, tau_sparse = plan
        per = lambda x: tf.cast(x, grad.dtype)[0] if owners is None else tf.gather(tf.cast(x, grad.dtype), owners)
        acc, _ = self.accumulate(residual, grad, {})
        each = (stats.Fit(per(fit.mu), fit.alpha, fit.beta, fit.family), key_size, per(edge), per(tau_key),
                per(tau_sparse))
        energy = tf.reduce_sum(tf.square(tf.cast(acc, tf.float32)))
        return acc, fused.mask_bytes(acc, self.mask(acc, grad, {}, each)), energy

    def bounds(self, n, steps):
        """The floor and ceiling, in values, of gradients of ``n`` elements (float64 tensors)
        that saw ``steps`` steps: int32 ``(low, high)``."""
        one = tf.constant(1.0, tf.float64)
        floor, warmup = self.research.density_floor, self.research.warmup_steps
        low = tf.minimum(n, tf.maximum(one, tf.math.ceil(floor * n))) if floor > 0 else 0 * n
        high = tf.maximum(low, tf.floor(self.density_ceiling * n))
        if warmup > 0 and floor > 0:
            low = tf.clip_by_value(tf.math.ceil(self.floor(steps) * n), low, high)
        return tf.cast(low, tf.int32), tf.cast(high, tf.int32)

    def guard_all(self, acc, candidates, layout, steps):
        """The guards of every gradient of a batch at once (``batch.Layout``; ``steps``, float64
        ``[T]``, what each prediction has seen): the candidates' flat indices, the largest
        ``high`` of each gradient over its ceiling (``top_each``), and exact top-k of each one under
        its floor (the warm-up's while it lasts; a loop over those alone); ascending."""
        low, high = self.bounds(layout.elements(acc), steps)
        counts = tf.cast(layout.count(candidates.indices), tf.int32)
        indices = tf.cond(tf.reduce_any(counts > high), lambda: top_each(acc, candidates.indices, layout, high),
                          lambda: candidates.indices)
        return tf.cond(tf.reduce_any(counts < low), lambda: topped_up(acc, indices, layout, counts, low),
                       lambda: indices)

    def guard(self, acc, candidates, steps):
        """``guard_all`` of one gradient (its prediction has seen ``steps``)."""
        return self.guard_all(acc, candidates, batch_step.Layout((None,), self.research.sample_size), steps[None])


def top_each(x, indices, layout, high):
    """Of the ascending flat ``indices`` into ``x`` (each gradient's own of ``layout``), the
    ``high`` of largest magnitude of each gradient (all of a gradient that has fewer), ascending:
    the candidates narrowed to those that can be among them (``_reaching``), then one stable sort
    by gradient, then by magnitude, largest first (ties: the lower index, as ``topk.top_among``),
    whose first ``high`` of each gradient are marked back in index order."""
    magnitude = tf.bitcast(tf.abs(tf.cast(tf.gather(x, indices), tf.float32)), tf.int32)
    owner, gradients = layout.owner(indices), len(layout.sizes)
    reaching = _reaching(magnitude, owner, gradients, high)
    indices, magnitude, owner = (tf.boolean_mask(t, reaching) for t in (indices, magnitude, owner))
    counts = tf.math.unsorted_segment_sum(tf.ones_like(owner), owner, gradients)
    order = tf.argsort(tf.cast(owner, tf.int64) * 2 ** 31 + (2 ** 31 - 1 - tf.cast(magnitude, tf.int64)), stable=True)
    starts = tf.gather(tf.cumsum(counts, exclusive=True), owner)
    rank = tf.range(tf.size(indices)) - tf.gather(starts, order)
    keep = rank < tf.gather(high, tf.gather(owner, order))
    return tf.boolean_mask(indices, tf.scatter_nd(order[:, None], tf.cast(keep, tf.int32), tf.shape(order)) > 0)


def _reaching(magnitude, owner, gradients, high):
    """Whether each candidate (its magnitude's float32 bits, int32, and its gradient) can be among
    the ``high`` largest of its gradient: its magnitude lies in the bucket (an eighth of an octave:
    the top bits of the float) of its gradient's ``high``-th largest, or above. One histogram of
    the candidates by gradient and bucket; exact, ties included, so the sort after it sorts about
    ``high`` values, not every candidate."""
    bucket = magnitude // (1 << _BUCKET_SHIFT)
    histogram = tf.math.unsorted_segment_sum(tf.ones_like(bucket), owner * _BUCKETS + bucket, gradients * _BUCKETS)
    at_least = tf.cumsum(tf.reshape(histogram, [gradients, _BUCKETS]), axis=1, reverse=True)
    lowest = tf.reduce_sum(tf.cast(at_least >= high[:, None], tf.int32), axis=1) - 1  # -1: fewer than high
    return bucket >= tf.gather(lowest, owner)


def topped_up(x, indices, layout, counts, low):
    """``indices`` with each gradient of ``layout`` that has fewer than ``low`` of them (``counts``)
    replaced by exact top-``low`` of that gradient (``topk.top_k``: a loop over those alone),
    ascending."""
    under = counts < low
    kept = tf.boolean_mask(indices, tf.gather(tf.logical_not(under), layout.owner(indices)))
    todo = tf.cast(tf.where(under)[:, 0], tf.int32)
    offsets, sizes = layout.bounds(x)

    def one(j, chosen):
        t = todo[j]
        return j + 1, chosen.write(j, topk.top_k(x[offsets[t]:offsets[t] + sizes[t]], low[t]) + offsets[t])

    chosen = tf.TensorArray(tf.int32, size=tf.size(todo), infer_shape=False, element_shape=[None])
    _, chosen = tf.while_loop(lambda j, _: j < tf.size(todo), one, (tf.constant(0), chosen))
    return tf.sort(tf.concat([kept, chosen.concat()], 0))
