"""Link budget: how much of a gradient a step sends, priced in wall-clock time.

GradPart's entropy rule decides *which* values are worth sending; this module
decides *how many*, from what the running job measures (derivation in
docs/algorithm.md, "Pricing a sent value in time"). Progress per step grows
like ``density ** g`` (``EXPONENT``); a step costs its non-link time ``T``
plus its link time ``L``; so progress per second ``d ** g / (T + L)`` is
largest when the payload takes ``g / (1 - g) * T`` on the link. Each rank
measures, per step, the time between its first ``compress`` calls (the step),
the time its collectives took (from a ``compress``'s end until the next
``decompress`` holds the gathered rows) and the share of elements it sent. The
first gradient's marker carries these figures through Horovod's own allreduce,
so every rank updates this controller from the same means (the reduced figures
over the reduced marker, which undoes Sum, Average and any scaling) and takes
the same decisions on the same step. Sparse steps move one shared price, nats
added to every area's position cost, by ``GAIN`` per e-fold of the bytes sent
over the target ``g / (1 - g) * T`` times the bandwidth (a target in bytes,
not in link time: a collective's fixed cost, Horovod's cycle and latency, is
not what the price can buy down). The price starts at ``START_PRICE`` (about
the density ceiling), so the first payloads are large enough to measure the
link, and never rises above 0: the link may buy more than the entropy rule
alone sends, never less. A dense step (Horovod's allreduce of the gradient
with its residual flushed in, no compress pass) is taken while its rate ``1 /
(T + D)`` beats the best sparse rate the bandwidth allows. A dense step
measures the bandwidth; sparse steps give their payload's throughput (link
time less the collective's fixed cost, the least sparse link time seen;
smoothed), which replaces the estimate at first, when it is higher, and when
it falls below half of it (a slower link). A one-step dense probe refreshes it
whenever the sparse steps since the last dense one add up to ``1 /
PROBE_SHARE`` dense steps, and comes at once while no dense step has measured
the link, the sparse link time is under the step's other time and the probe
would cost at most 20 of those (mostly fixed cost: such payloads say little of
the link, and neither lowers the estimate). Outside a traced function (eager
``hvd.allreduce``) nothing is measured: the exchange stays sparse and the
price stays out of the thresholds.
"""
import weakref

import tensorflow as tf

EXPONENT = 0.16     # g: progress per step ~ density**g (Top-k's frontier, docs/algorithm.md)
GAIN = 0.3          # price change (nats) per e-fold of bytes sent over their target
START_PRICE = -10.0  # nats: about the density ceiling on a 1M-element area, a payload that measures the link
PRICE_LIMIT = 20.0  # |price| bound, nats (a position among 1e8 costs 18.4)
PROBE_SHARE = 0.05  # a dense probe costs at most this share of the sparse time since the last
SMOOTHING = 0.8     # weight of the past in the measured non-link time
VALUE_BYTES = 6.0   # bytes a sparse value costs on the wire (int32 index + fp16 value)
FIGURES = 4         # what the first marker carries: step s, link s, sent share, valid


class Budget(tf.Module):
    """The link controller of one compressor: shared price, dense/sparse mode, measurements.

    Args:
        density_ceiling: the most a sparse step may send (the compressor's guard).
    """

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_last_call"}

    def __init__(self, density_ceiling):
        super().__init__(name="budget")
        self.ceiling = density_ceiling
        f64 = lambda value, name: tf.Variable(tf.constant(value, tf.float64), trainable=False, name=name)
        self.price = f64(START_PRICE, "price")        # nats added to every position cost
        self.dense = f64(0.0, "dense")                # 1: the next steps hand Horovod the gradient
        self.step_dense = f64(0.0, "step_dense")      # the mode of the step now running
        self.measured_dense = f64(0.0, "measured_dense")  # ... of the step its figures describe
        self.started = f64(0.0, "started")            # timestamp of this step's first compress
        self.link_s = f64(0.0, "link_s")              # this step's collective time so far
        self.left_at = f64(0.0, "left_at")            # timestamp of the last compress's end
        self.sent = f64(0.0, "sent")                  # elements this step sent ...
        self.total = f64(0.0, "total")                # ... of the elements it exchanged
        self.elements = f64(0.0, "elements")          # elements the last step exchanged
        self.steps = f64(0.0, "steps")                # steps begun
        self.other_s = f64(0.0, "other_s")            # non-link time per step (smoothed, shared)
        self.bandwidth = f64(0.0, "bandwidth")        # bytes/s of the link (shared)
        self.fixed_s = f64(0.0, "fixed_s")            # a collective's fixed cost: least sparse link time
        self.payload_bw = f64(0.0, "payload_bw")      # sparse payloads' throughput (smoothed, shared)
        self.probed = f64(0.0, "probed")              # 1 once a dense step has measured the link
        self.since_dense_s = f64(0.0, "since_dense_s")  # sparse step time since the last dense step
        self._last_call = weakref.WeakKeyDictionary()  # function graph -> "compress" / "decompress"

    def restart(self):
        """Back to the state at creation, so every figure is measured again (elastic training
        calls it when the set of ranks, and with it the links, changed)."""
        for var in self.variables:
            var.assign(tf.constant(START_PRICE if var is self.price else 0.0, tf.float64))

    def read(self):
        """The controller's state as Python floats (for logs)."""
        return {"dense": bool(self.dense.numpy() > 0.5), "price_nats": float(self.price.numpy()),
                "other_ms": 1e3 * float(self.other_s.numpy()), "fixed_ms": 1e3 * float(self.fixed_s.numpy()),
                "bandwidth_MBps": float(self.bandwidth.numpy()) / 1e6, "steps": int(self.steps.numpy())}

    # Trace-time hooks, called by the compressor ------------------------------------------------

    def starts(self, graph):
        """Whether the ``compress`` now traced in ``graph`` is its step's first."""
        return graph not in self._last_call

    def begin(self, graph):
        """At a step's first ``compress`` in ``graph``: closes the last step's figures and opens
        this one's. Returns ``(dense, figures)``: this step's mode (bool) and the float32
        figures its first marker carries."""
        self._last_call[graph] = None
        now = tf.timestamp()
        valid = tf.cast((self.steps >= 2.0) & (self.started > 0.0), tf.float64)
        share = tf.math.divide_no_nan(self.sent, self.total)
        figures = tf.cast(tf.stack([now - self.started, self.link_s, share, valid]), tf.float32)
        self.measured_dense.assign(self.step_dense)
        self.step_dense.assign(self.dense)
        self.elements.assign(self.total)
        for var, value in ((self.started, now), (self.link_s, 0.0), (self.sent, 0.0), (self.total, 0.0)):
            var.assign(value)
        self.steps.assign_add(1.0)
        return self.dense > 0.5, figures

    def mode(self):
        """The running step's mode, for gradients after the first."""
        return self.step_dense > 0.5

    def count(self, sent, total):
        """Adds a gradient's sent and exchanged elements to this step's share."""
        self.sent.assign_add(tf.cast(sent, tf.float64))
        self.total.assign_add(tf.cast(total, tf.float64))

    def left(self, graph, after):
        """A ``compress`` ended once ``after`` (its output) exists; returns ``after``."""
        self._last_call[graph] = "compress"
        with tf.control_dependencies(tf.nest.flatten(after)):
            stamp = self.left_at.assign(tf.timestamp())
        with tf.control_dependencies([stamp]):
            return tf.nest.map_structure(tf.identity, after)

    def arrived(self, graph, reduced):
        """A ``decompress`` starts with ``reduced`` in hand: the first after a ``compress``
        closes a collective interval. Returns ``reduced``."""
        if self._last_call.get(graph) != "compress":
            return reduced
        self._last_call[graph] = "decompress"
        with tf.control_dependencies(tf.nest.flatten(reduced)):
            added = self.link_s.assign_add(tf.timestamp() - self.left_at)
        with tf.control_dependencies([added]):
            return tf.nest.map_structure(tf.identity, reduced)

    def update(self, reduced_figures, marker):
        """Folds the shared figures of the last step into the controller and decides the mode
        of the step after this one; ``reduced_figures / marker`` are the means over ranks.
        Returns the update op."""
        figures = tf.reshape(tf.cast(reduced_figures / marker, tf.float64), [FIGURES])
        step_s, link_s, share, valid = tf.unstack(figures)
        zero, link_s = tf.zeros([], tf.float64), tf.maximum(link_s, 1e-6)
        ok = valid > 0.5
        dense_step, sparse_step = ok & (self.measured_dense > 0.5), ok & (self.measured_dense < 0.5)
        dense_bytes = 4.0 * self.elements  # float32 values of a dense exchange
        sent_bytes = share * self.elements * VALUE_BYTES
        smooth = lambda old, new, when: tf.where(
            when, tf.where(old > 0.0, SMOOTHING * old + (1 - SMOOTHING) * new, new), old)
        other = tf.maximum(step_s - link_s, 1e-4)
        other = tf.where(self.other_s > 0.0, tf.minimum(other, 4.0 * self.other_s), other)  # a pause
        other_s = smooth(self.other_s, other, ok)
        fixed_s = tf.where(sparse_step, tf.where(self.fixed_s > 0.0, tf.minimum(link_s, 1.02 * self.fixed_s), link_s),
                           self.fixed_s)
        # a payload tells of the link only where it takes time of its own: its link time is well
        # over the fixed cost, and at the bandwidth so far it would take half that cost or more
        informative = sparse_step & (link_s > 2.0 * fixed_s) & (
            (self.bandwidth == 0.0) | (sent_bytes >= 0.5 * fixed_s * self.bandwidth))
        payload_bw = smooth(self.payload_bw, sent_bytes / tf.maximum(link_s - fixed_s, 1e-6), informative)
        bandwidth = self.bandwidth_from(dense_step, sparse_step, dense_bytes / link_s, sent_bytes / link_s,
                                        payload_bw, informative)
        target_bytes = EXPONENT / (1 - EXPONENT) * other_s * bandwidth
        moves = sparse_step & (sent_bytes > 0.0) & (target_bytes > 0.0)
        step = GAIN * tf.math.log(tf.math.divide_no_nan(sent_bytes, target_bytes))
        price = tf.where(moves, tf.clip_by_value(self.price + step, -PRICE_LIMIT, 0.0), self.price)
        since = tf.where(sparse_step, self.since_dense_s + step_s, tf.where(dense_step, zero, self.since_dense_s))
        dense_link = tf.math.divide_no_nan(dense_bytes, bandwidth)
        known = (other_s > 0.0) & (bandwidth > 0.0)
        dense = self.choose(other_s, dense_link, bandwidth, dense_bytes)
        probed = tf.where(dense_step, tf.ones([], tf.float64), self.probed)
        # A sparse link time under the step's other time says little of the bandwidth (it is
        # mostly fixed cost): the first probe then comes at once, if even at the bandwidth so
        # far (a lower bound) it costs no more than the probes' share of 20 steps.
        blind = (sparse_step & (probed < 0.5) & (link_s < other_s)
                 & (tf.math.divide_no_nan(dense_bytes, bandwidth) * PROBE_SHARE <= other_s))
        probe = known & ~dense & ((since * PROBE_SHARE >= other_s + dense_link) | blind)
        dense = tf.where(known, dense | probe, self.dense > 0.5)
        return tf.group(
            self.other_s.assign(other_s), self.fixed_s.assign(fixed_s), self.payload_bw.assign(payload_bw),
            self.bandwidth.assign(bandwidth),
            self.price.assign(price), self.since_dense_s.assign(tf.where(probe, zero, since)),
            self.probed.assign(probed),
            self.dense.assign(tf.cast(dense, tf.float64)))

    def bandwidth_from(self, dense_step, sparse_step, dense_bw, first_bw, payload_bw, informative):
        """The bandwidth after a step: a dense step measures it; the first sparse step gives a
        lower bound (its payload over its link time); later sparse steps whose link time is well
        above the fixed cost (``informative``) give their payload's throughput (link time less
        the fixed cost, smoothed), taken when it is higher (a faster link) or below half the
        estimate (a slower link)."""
        old = self.bandwidth
        moved = informative & ((payload_bw > old) | (2.0 * payload_bw < old))
        sparse = tf.where(old == 0.0, first_bw, tf.where(moved, payload_bw, old))
        return tf.where(dense_step, dense_bw, tf.where(sparse_step, sparse, old))

    def choose(self, other_s, dense_link_s, bandwidth, dense_bytes):
        """Whether a dense step makes more progress per second than the best sparse one:
        ``1 / (T + D)`` against ``d ** g / (T + L)`` at the time-optimal link time
        ``L = g / (1 - g) * T`` (or the density ceiling, if that comes first)."""
        values_per_s = bandwidth / VALUE_BYTES
        elements = dense_bytes / 4.0
        link = EXPONENT / (1 - EXPONENT) * other_s
        density = tf.minimum(tf.math.divide_no_nan(link * values_per_s, elements), self.ceiling)
        link = tf.math.divide_no_nan(density * elements, values_per_s)
        sparse_rate = tf.math.divide_no_nan(density ** EXPONENT, other_s + link)
        dense_rate = tf.math.divide_no_nan(1.0, other_s + dense_link_s)
        return dense_rate >= sparse_rate
