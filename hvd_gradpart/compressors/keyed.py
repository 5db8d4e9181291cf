"""GradPart through Horovod's own allreduce: a key area every rank computes alike, one collective a step.

Ranks stay bit-identical, so what Horovod's reduced sums say is known to every rank without a
message. From them each gradient's slot keeps, alike on every rank, a *rate* per element (the
mean over ranks of what was last sent there, over the steps it had accumulated) and the step it
was last sent: ``rate * (t - last)`` predicts what has accumulated there since. The *key area*
of a step is where that prediction passes the entropy threshold of the gradient's predicted
distribution (``exp(h) * log n``, as ``GradPartCompressor``'s rule), and the positions the ranks
nominated on the step before. ``compress`` hands Horovod one dense vector: the accumulated values
(gradient plus residual) at the key area, zeros up to a size bucket (12.5 % steps: the shape
changes rarely), this rank's figures of its fresh gradient, a finite flag and a digest of the key
area. ``decompress`` scatters the reduced values back into a dense gradient. Horovod's fusion,
grouped and per-tensor paths, ``Average``/``Sum``, pre/postscale and
``gradient_predivide_factor`` apply as to any tensor, and the bytes a node receives follow the
ring allreduce's ``2 (N - 1) / N``.

The sparse area gets in by *nomination*: each rank thresholds what is left of its accumulated
values outside the key area and sends up to ``capacity`` of them (the largest, with their
positions) in a fixed-size ``hvd.allgather`` issued beside the allreduce and read only after it
(no collective of a step waits on another); their rate becomes infinite, so the next step's key
area takes the other ranks' residuals there. The reduced figures (means over ranks) give the
distribution's next prediction (an EMA over steps, as ``stats.predict``): the thresholds, too,
are the same on every rank.

Error feedback is exact: the residual becomes the accumulated values less what was sent. The
residual and the shared state are written in ``decompress`` and only when the reduced flag is
finite: a rank whose accumulated values hold NaN or Inf sends a NaN flag, every rank's result
then holds a NaN (a loss scale that overflowed on any rank: every rank skips the step), and every
rank keeps its residual and state. Ranks whose key areas differ (another model, setting or
library) stop at the digest check with an error that says so.
"""
import dataclasses
import math
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_gradpart import entropy, exchange, fused, metrics, momentum, stats
from hvd_gradpart.compressors.base import SPARSE_DTYPES, BaseCompressor, _OnDefaultInstance
from hvd_gradpart.compressors.gradpart import _START, Prediction

TAIL = 6  # the vector's last elements: ``moments`` of the fresh gradient (3), the flag, a digest d, d^2
_OFFERED, _GAIN, _MOVE = 2.0, 0.5, 1.5  # a rank's candidates aim at twice its capacity, moving its
                                       # threshold by the root of the miss, at most 1.5x a step
_DIGESTS = {tf.float16: 4, tf.bfloat16: 2}  # digests whose d^2 a sum of 16 ranks holds exactly (else 64)


@dataclasses.dataclass(frozen=True)
class KeyedResearch:
    """The keyed exchange's knobs; invalid values raise ``ValueError``."""

    sample_size: int = 4096        # elements of the fresh gradient sampled (strided) for its moments
    prediction_decay: float = 0.9  # EMA weight of the previous steps' fit (``stats.predict``)
    margin: float = 0.0            # nats added to the position cost (> 0: a sparser exchange)
    nominate: float = 0.002        # the most positions a rank nominates a step, as a fraction of the tensor

    def __post_init__(self):
        checks = {"sample_size": (lambda v: isinstance(v, int) and v >= 16, "an int >= 16"),
                  "prediction_decay": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
                  "margin": (lambda v: math.isfinite(v) and v >= 0.0, "finite and >= 0"),
                  "nominate": (lambda v: 0.0 < v <= 1.0, "in (0, 1]")}
        for name, (valid, text) in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not valid(value):
                raise ValueError(f"KeyedResearch: {name} must be {text}, got {value!r}")


class KeyedContext(NamedTuple):
    """What ``compress`` hands ``decompress`` for a gradient of the keyed exchange."""

    original: tf.Tensor   # the gradient as Horovod handed it (shape, dtype)
    slot: object          # its ``memory.Slot``
    key: tf.Tensor        # int32 ``[c]``: the key area, ascending
    local: object         # ``Local``: what is stored of this rank's own step
    outliers: tf.Tensor   # uint8: every rank's nominations and their values, gathered (``pack``)
    mismatch: str         # the error when ranks disagree
    momentum: float       # the momentum of the optimizer the sum is handed to (0: as it is)


class KeyedCompressor(BaseCompressor):
    """GradPart's key area through Horovod's own allreduce; no argument needs setting.

    Args:
        density_ceiling: the most of a tensor its key area holds, as a fraction in (0, 1].
        value_encoding: "fp16" sends the vector in float16 (what rounding removes stays in the
            residual; Horovod sums it in float16, as its own fp16 compressor); "native" in the
            gradient's dtype.
        min_elements: tensors with fewer elements go to Horovod's allreduce untouched.
        optimizer_momentum: the momentum of the SGD optimizer that applies the sums, so that it
            applies each sum once (``hvd_gradpart.momentum``). None (the default) reads it from
            the Keras optimizer under ``hvd.DistributedOptimizer``; with
            ``hvd.DistributedGradientTape`` pass it (0 for Adam or SGD without momentum).
        research: ``KeyedResearch``: the knobs of studies; its defaults are the tested ones.
    """

    RESEARCH = KeyedResearch
    DIAGNOSTICS = ("key_size", "nominees", "tau")
    SHARED_STATE = ("rate", "last", "prediction")  # what every rank derives alike from the reduced sums

    def __init__(self, density_ceiling=0.02, value_encoding="fp16", min_elements=1024, optimizer_momentum=None,
                 research=KeyedResearch()):
        super().__init__(min_elements=min_elements)
        if not isinstance(research, KeyedResearch):
            raise TypeError(f"KeyedCompressor: research must be a KeyedResearch, got {research!r}")
        if isinstance(density_ceiling, bool) or not isinstance(density_ceiling, (int, float)) or not (
                0.0 < density_ceiling <= 1.0):
            raise ValueError(f"KeyedCompressor: density_ceiling must be in (0, 1], got {density_ceiling!r}")
        exchange.wire_dtype(tf.float32, value_encoding)
        self.density_ceiling = density_ceiling
        self.value_encoding = value_encoding
        self.optimizer_momentum = momentum.validate(optimizer_momentum, type(self).__name__)
        self.research = research

    def state_spec(self):
        return {"rate": lambda n, dtype: tf.zeros([n + 1], dtype),  # [n]: where padded positions land
                "last": lambda n, dtype: tf.zeros([n + 1], dtype),
                "prediction": lambda n, dtype: tf.constant(_START, tf.float64),
                "nominate_at": lambda n, dtype: tf.constant(1.0, tf.float64)}

    def shared(self, slot):
        """The variables of ``slot`` that every rank holds alike."""
        return [slot.state[name] for name in self.SHARED_STATE]

    @_OnDefaultInstance
    def compress(self, tensor):
        """``(vector, KeyedContext)`` of a tensor this method compresses (``sparsifies``); a
        smaller float tensor whole, in the wire's dtype (so a group holds one dtype: Horovod's
        grouped allreduce takes no other), anything else untouched."""
        if self.sparsifies(tensor):
            return self._compress(tensor)
        if tensor.dtype in SPARSE_DTYPES:
            wire = exchange.wire_dtype(tensor.dtype, self.value_encoding)
            if wire != tensor.dtype:
                return exchange.to_wire(tensor, wire), tensor.dtype
        return tensor, None

    def _compress(self, tensor):
        slot = self.memory.slot(tensor, self.state_spec())
        slot.metrics.declare(metrics.COUNTERS + self.DIAGNOSTICS)
        n, dtype = tensor.shape.num_elements(), tensor.dtype
        wire = exchange.wire_dtype(dtype, self.value_encoding)
        grad = tf.reshape(tensor, [-1])
        state = slot.state
        prediction = Prediction.of(state["prediction"].read_value())
        t = prediction.steps + 1
        tau, edge = self.thresholds(prediction, n)
        at = edge * state["nominate_at"].read_value()
        sweep = fused.by_size(_sweep, n)
        acc, key_bytes, candidate_bytes = sweep(slot.residual.value(), grad, state["rate"].value(),
                                                state["last"].value(), tf.cast(t, dtype), tf.cast(tau, dtype),
                                                tf.cast(at, dtype))
        key = capped(fused.compact(key_bytes).indices, lambda k: tf.abs(
            tf.gather(state["rate"], k) * (tf.cast(t, dtype) - tf.gather(state["last"], k))),
            self.ceiling(n))
        candidates = fused.compact(candidate_bytes)
        values = exchange.to_wire(tf.gather(acc, key), wire)
        kept = fused.subtract_at(acc, key, tf.cast(values, dtype))
        capacity = max(1, math.ceil(self.research.nominate * n))
        nominees = capped(candidates.indices, lambda c: tf.abs(tf.gather(kept, c)), capacity)
        count = tf.size(nominees)
        outliers = exchange.to_wire(tf.gather(kept, nominees), wire)
        kept = fused.subtract_at(kept, nominees, tf.cast(outliers, dtype))
        payload = pack(tf.pad(nominees, [[0, capacity - count]], constant_values=n),  # one shape: padded
                       tf.pad(outliers, [[0, capacity - count]]))                    # with the spare n
        setting = f"{type(self).__name__}{self.settings()}"
        digest = tf.cast(self.digest(key, exchange.digest(f"{n}/{dtype.name}/{setting}"), wire), wire)
        finite = fused.finite(acc, candidates)
        flag = tf.where(finite, tf.constant(1.0, wire), tf.constant(float("nan"), wire))
        size = tf.size(key)
        tail = tf.concat([tf.cast(moments(grad, self.research.sample_size), wire), [flag, digest, digest * digest]], 0)
        vector = tf.concat([values, tf.zeros([bucket(size) - size], wire), tail], 0)
        sent = tf.cast(tf.size(vector), tf.float64) * wire.size + float(capacity * (4 + wire.size))
        metrics.record(slot.metrics.figures, elements=n, dense_bytes=n * dtype.size,
                       sent_elements=tf.size(vector), sent_bytes=sent, key_size=size,
                       nominees=count, tau=tau)
        mismatch = (f"hvd_gradpart: ranks disagree on the key area of gradient {slot.key} ({dtype.name}"
                    f"{tensor.shape}) under {setting}: every rank must build the same model and the same "
                    "compressor settings, and restore the same checkpoint")
        local = Local(kept, candidates.count, capacity)
        beta = momentum.calling_optimizer() if self.optimizer_momentum is None else self.optimizer_momentum
        return vector, KeyedContext(tensor, slot, key, local, hvd.allgather(payload), mismatch, beta)

    def ceiling(self, n):
        """The most positions the key area of an ``n``-element tensor holds."""
        return max(1, math.ceil(self.density_ceiling * n))

    def thresholds(self, prediction, n):
        """The key area's and the nominations' thresholds (float64) from the predicted distribution:
        the entropy rule, ``exp(h)`` times the nats of a position among ``n`` (plus the margin),
        for the key area; the partition boundary (information beyond the entropy) for what a rank
        nominates, whose count the capacity bounds. Both 0 before the first step (every
        accumulated value a candidate, so the first nominations are each rank's largest)."""
        fit, seen = prediction.fit(), prediction.steps > 0
        cost = entropy.position_cost(n) + self.research.margin
        return (tf.where(seen, entropy.power_threshold(fit, cost), 0.0),
                tf.where(seen, entropy.threshold(fit, 0.0), 0.0))

    @staticmethod
    def digest(key, header, dtype):
        """A small whole number ``d`` from the key area and the settings' ``header`` (``d ** 2``
        summed over 16 ranks is exact in ``dtype``)."""
        spread = tf.reduce_sum(tf.cast(key % 65521, tf.int64) * 7 + 1) + header
        return tf.cast(spread % _DIGESTS.get(dtype, 64) + 1, dtype)

    @_OnDefaultInstance
    def decompress(self, tensor, ctx):
        """The reduced key area and every rank's nominations scattered into a dense gradient; the
        residual and the shared state stored when every rank's flag was finite (else a NaN at
        element 0, nothing stored)."""
        if not isinstance(ctx, KeyedContext):
            return tensor if ctx is None else tf.cast(tensor, ctx)
        n, size, dtype = ctx.original.shape.num_elements(), tf.size(ctx.key), ctx.original.dtype
        tail = tf.cast(tensor[-TAIL:], tf.float64)
        flag = tail[-3]
        finite = tf.math.is_finite(flag)
        mean, square = tail[-2] / flag, tail[-1] / flag
        agree = tf.debugging.Assert(tf.logical_not(finite) | (tf.abs(square - mean * mean) <= 1e-3 * square),
                                    [ctx.mismatch])  # the digests' variance over ranks: 0 when they agree
        values = tf.cast(tensor[:size], dtype)
        nominees, outliers = unpack(ctx.outliers, ctx.local.capacity, tensor.dtype)
        outliers = tf.cast(outliers, dtype) * tf.cast(flag / tf.cast(exchange.world_size(), tf.float64), dtype)
        poison = tf.where(finite, tf.constant(0.0, dtype), tf.constant(float("nan"), dtype))  # at element 0
        with tf.control_dependencies([agree]):
            at = tf.concat([ctx.key, tf.minimum(nominees, n - 1), [0]], 0)  # padding adds its 0 to element n - 1
            total = tf.scatter_nd(at[:, None], tf.concat([values, outliers, [poison]], 0), [n])
        stored = tf.cond(finite, lambda: self._store(tensor, tail, nominees, ctx), lambda: tf.constant(False))
        if ctx.momentum > 0:
            total = momentum.hand_over(total, ctx.slot.delivery(), ctx.momentum)
        with tf.control_dependencies([stored]):
            return tf.reshape(total, ctx.original.shape)

    def _store(self, tensor, tail, nominees, ctx):
        """The residual, the key area's rates and steps, the nominations, the prediction and this
        rank's nomination threshold."""
        state, local = ctx.slot.state, ctx.local
        flag = tail[-3]
        prediction = Prediction.of(state["prediction"].read_value())
        t = prediction.steps + 1
        n, dtype = ctx.original.shape.num_elements(), ctx.original.dtype
        pad = [[0, self.ceiling(n) - tf.size(ctx.key)]]  # one shape per tensor size: one compile
        key = tf.pad(ctx.key, pad, constant_values=n)  # padded with the spare position n
        means = tf.pad(tf.cast(tensor[:tf.size(ctx.key)], dtype) / tf.cast(flag, dtype), pad)
        stored = fused.by_size(_stored, n)(state["rate"], state["last"], key, means, nominees, tf.cast(t, dtype))
        fit = stats.predict(prediction.fit(), fitted(*tf.unstack(tail[:3] / flag, num=3)), prediction.steps,
                            self.research.prediction_decay)
        fit = stats.Fit(*(tf.where(tf.math.is_finite(f), f, p) for f, p in zip(fit[:3], prediction.fit()[:3])),
                        fit.family)
        offered = tf.cast(local.offered, tf.float64) / (_OFFERED * local.capacity)
        moved = tf.clip_by_value(tf.pow(tf.maximum(offered, 1e-6), _GAIN), 1 / _MOVE, _MOVE)
        writes = [stored, ctx.slot.residual.assign(local.kept, read_value=False),
                  state["prediction"].assign(tf.stack(Prediction(fit.mu, fit.alpha, fit.beta, t)),
                                             read_value=False),
                  state["nominate_at"].assign(state["nominate_at"] * moved, read_value=False)]
        with tf.control_dependencies(writes):
            return tf.constant(True)


class Local(NamedTuple):
    """What ``decompress`` stores of this rank's own step."""

    kept: tf.Tensor      # the next residual: the accumulated values less what was sent
    offered: tf.Tensor   # int32: the candidates this rank could nominate
    capacity: int        # the most it nominates


@tf.function(jit_compile=True)
def _sweep(residual, grad, rate, last, t, tau, at):
    """One pass: the accumulated values, the key area's mask bytes (the predicted accumulation
    ``|rate (t - last)|`` past ``tau``) and the nomination candidates' (``|acc|`` past ``at``
    outside the key area, and every non-finite element: ``fused.mask_bytes``)."""
    acc = residual + grad
    n = tf.size(acc)
    key = tf.abs(rate[:n] * (t - last[:n])) > tau
    return acc, fused.word_bytes(key), fused.mask_bytes(acc, (tf.abs(acc) > at) & tf.logical_not(key))


@tf.function(jit_compile=True)
def _stored(rate, last, key, means, nominees, t):
    """Stores the shared state of a step: at the key area the rate becomes the mean over ranks of
    what was sent over the steps it accumulated, and the step ``t``; nominees' rate becomes
    infinite. Padding positions (of ``key`` and ``nominees``: fixed shapes, so one compile serves
    many steps) land in the spare last element; compiled, the variables update in place."""
    at = key[:, None]
    since = t - tf.gather(last, key)
    updated = tf.tensor_scatter_nd_update(rate.value(), tf.concat([at, nominees[:, None]], 0), tf.concat(
        [means / since, tf.fill(tf.shape(nominees), tf.constant(float("inf"), rate.dtype))], 0))
    rate.assign(updated, read_value=False)
    last.assign(tf.tensor_scatter_nd_update(last.value(), at, tf.fill(tf.shape(key), t)), read_value=False)
    return tf.constant(True)


def pack(positions, values):
    """One rank's nominations as the bytes of its ``positions`` (int32) and then its ``values``."""
    as_bytes = lambda x: tf.reshape(tf.bitcast(x, tf.uint8), [-1])
    return tf.concat([as_bytes(positions), as_bytes(values)], 0)


def unpack(gathered, capacity, wire):
    """Every rank's nominations from the gathered ``pack`` blocks (``capacity`` each): positions
    (int32) and values (``wire``), in rank order."""
    blocks = tf.reshape(gathered, [-1, capacity * (4 + wire.size)])
    positions = tf.bitcast(tf.reshape(blocks[:, :4 * capacity], [-1, 4]), tf.int32)
    return positions, tf.bitcast(tf.reshape(blocks[:, 4 * capacity:], [-1, wire.size]), wire)


def capped(indices, magnitude, most):
    """Ascending ``indices``, only the ``most`` of largest ``magnitude(indices)`` when there are more."""
    return tf.cond(tf.size(indices) > most,
                   lambda: tf.sort(tf.gather(indices, tf.math.top_k(magnitude(indices), most).indices)),
                   lambda: indices)


def moments(grad, sample_size):
    """The nonzero values of a strided sample of ``grad``, described scale-free so that float16
    carries them (a tensor in ``grad``'s dtype): their mean over their mean absolute deviation,
    and the logs of that deviation and of the variance (-inf when the sample is all zeros)."""
    sample, valid = stats.fixed_sample(grad, sample_size)
    x = tf.cast(sample, tf.float64)
    w = tf.cast(tf.not_equal(x, 0) & valid, tf.float64)
    mean_of = lambda v: tf.math.divide_no_nan(tf.reduce_sum(w * v), tf.reduce_sum(w))
    mu = mean_of(x)
    deviation = tf.abs(x - mu)
    spread = mean_of(deviation)
    logs = tf.math.log(tf.stack([spread, mean_of(deviation * deviation)]))
    return tf.cast(tf.concat([[tf.math.divide_no_nan(mu, spread)], logs], 0), grad.dtype)


def fitted(ratio, log_spread, log_square):
    """The GG fit of ``moments`` (float64): its shape from ``spread ** 2 / square``, its scale from
    the standard deviation."""
    beta = stats.beta_from_ratio(tf.exp(2 * log_spread - log_square))
    alpha = tf.exp(log_square / 2 - stats.log_sigma_over_alpha(beta))
    return stats.Fit(ratio * tf.exp(log_spread), alpha, beta, tf.constant(stats.GENERALIZED))


def bucket(size):
    """``size`` rounded up to a step of an eighth of its octave (so a key area's vector changes
    shape rarely); 0 stays 0."""
    octave = tf.cast(tf.floor(tf.math.log(tf.cast(tf.maximum(size, 1), tf.float64)) / math.log(2.0)), tf.int32)
    step = tf.maximum(tf.bitwise.left_shift(1, octave) // 8, 1)
    return (size + step - 1) // step * step
