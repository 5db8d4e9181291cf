"""Link budget: how much of a gradient a step sends, priced in wall-clock time.

GradPart's entropy rule decides *which* values are worth sending; this module
decides *how many*, from what the running job measures (derivation in
docs/algorithm.md, "Pricing a sent value in time"). Progress per step grows
like ``density ** g`` (``EXPONENT``) up to ``SATURATION``, where a step does
what a dense one does; a step costs its non-link time ``T``
plus its link time ``L``; so progress per second ``d ** g / (T + L)`` is
largest when the payload takes ``g / (1 - g) * T`` on the link. Each rank
measures, per step, the time between its first ``compress`` calls (the step),
the time its collectives took (from a ``compress``'s end until the next
``decompress`` holds the gathered payloads) and the bytes it sent per element. The
first gradient's marker carries these figures through Horovod's own allreduce,
so every rank updates this controller from the same means (the reduced figures
over the reduced marker, which undoes Sum, Average and any scaling) and takes
the same decisions on the same step. The link time is the least over ranks
(the mean less the spread, from the mean square the marker also carries): a
rank that reached the collective first also waited for the others' compute,
which is not the link's. Sparse steps move one shared price, nats
added to every area's position cost, by ``GAIN`` per e-fold of the bytes the
rule offered (its candidates before the density guards, at the bytes per value
sent) over the target ``g / (1 - g) * T`` times the bandwidth, at most the
density ceiling's bytes (a target in bytes, not in link time: a collective's
fixed cost, Horovod's cycle and latency, is not what the price can buy down;
and at the ceiling the bytes sent stop answering the price, which would
otherwise fall until every element is a candidate). The target's ``T`` is the least smoothed non-link time
seen (drifting up): a step's own selection and coding grow with what it sends,
and a target read from that time would buy itself ever more bytes. The price
starts at ``START_PRICE``, the entropy rule's own density, and moves within
``[-PRICE_LIMIT, 0]``: a fast link buys more than the entropy rule alone
sends, a slow one never less (payloads that small are mostly fixed cost, and a
link time they hardly move tells little of the link: a price free to rise ran
LeNet-5 to the density floor on a 10 Mbit/s link, and its steps got slower). A
dense step (Horovod's allreduce of the gradient with its residual flushed in,
no compress pass) is taken while its rate ``1 / (T_dense + D)`` beats the best
sparse rate the bandwidth allows; ``T`` and ``T_dense`` are measured apart
(a sparse step's compress passes are not a dense step's). A dense step
measures the bandwidth. Sparse steps fit a line ``link = fixed + bytes /
bandwidth`` through their recent (bytes, link time) points: its slope tells a
payload's time from the collective's fixed cost (Horovod's cycle, latency),
which a payload's own throughput cannot, as long as their bytes vary (the
entropy rule's counts do, step to step); once the price holds them steady, a
payload that took at least the fixed cost's time of its own gives its
throughput beyond it (a link that slowed). The price answers the smoothed
bytes: under error feedback a large payload drains the residual and the next
is small. The first sparse step's payload over
its link time gives a lower bound; a higher bound (a faster link) replaces the
estimate, and each step moves it ``FOLLOW`` of the way (in log) toward the
fitted line's (a dense step's measure, a link that changed; one noisy fit moves
it part way). That estimate prices the sparse steps; a dense step is priced at
what dense steps measured (small payloads' times are mostly fixed cost and
noise: their fitted line read a 12 MB/s link 3x too fast, and an unshaped one
at 3-5 MB/s where dense steps measured over 100 MB/s). A one-step dense probe
refreshes that measure (each dense step moves it half way, in log) whenever
the sparse steps since the last dense one add up to ``1 / PROBE_SHARE`` dense
steps (priced so), and comes at once while no dense step has measured the
link, the sparse link time is under the step's other time and the probe would
cost at most 20 of those (a fast link, whose payloads are mostly fixed cost).
Outside a traced function (eager
``hvd.allreduce``) nothing is measured: the exchange stays sparse and the
price stays out of the thresholds.
"""
import weakref

import tensorflow as tf

EXPONENT = 0.16     # g: progress per step ~ density**g (Top-k's frontier, docs/algorithm.md) ...
SATURATION = 0.1    # ... up to this density, where a step does as much as a dense one
GAIN = 1.0          # price change (nats) per e-fold of bytes offered over their target (docs/algorithm.md)
START_PRICE = 0.0   # nats: the entropy rule's own density, whose counts vary (what the fits need)
PRICE_LIMIT = 20.0  # the lowest price, nats (a position among 1e8 costs 18.4); the highest is 0
PROBE_SHARE = 0.05  # a dense probe costs at most this share of the sparse time since the last
SMOOTHING = 0.8     # weight of the past in the measured non-link time
FLOW_SMOOTHING = 0.8  # ... and in the bytes a sparse step sends (error feedback makes them bursty)
FADING = 0.9        # weight of the past in the bytes-to-link-time fit (about 10 steps)
FIT_STEPS = 5.0     # faded steps the fit needs ...
FIT_SPREAD = 0.25   # ... and the spread of their bytes (std over mean), to tell payload from fixed cost
LEAST_DRIFT = 1.005  # the least link time seen may rise this much a step (the fixed cost may change)
FOLLOW = 0.3        # share of the log-distance to the fitted bandwidth that one step covers
DENSE_FOLLOW = 0.5  # ... and to a dense step's measure, for the bandwidth that prices a dense step
VALUE_BYTES = 3.5   # bytes a sparse value costs on the wire at 0.3-3 % (fp16 and its gap code, docs/methods.md)
FIGURES = 7         # what the first marker carries: step s, link s, link s squared, bytes sent per element,
                    # valid, values sent per element, values the rule offered per element


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
        self.sent = f64(0.0, "sent")                  # bytes this step sent (as counted) ...
        self.values = f64(0.0, "values")              # values this step sent ...
        self.offered = f64(0.0, "offered")            # ... and the selection rule offered, before its guards ...
        self.total = f64(0.0, "total")                # ... of the elements it exchanged
        self.elements = f64(0.0, "elements")          # elements the last step exchanged
        self.steps = f64(0.0, "steps")                # steps begun
        self.other_s = f64(0.0, "other_s")            # non-link time of sparse steps (smoothed, shared)
        self.other_dense_s = f64(0.0, "other_dense_s")  # ... of dense steps (no compress pass)
        self.base_s = f64(0.0, "base_s")              # the least smoothed sparse non-link time (drifting up)
        # fading sums over sparse steps of 1, bytes, non-link s, bytes**2, bytes * non-link s
        self.work = [f64(0.0, f"work_{name}") for name in ("w", "b", "t", "bb", "bt")]
        self.bandwidth = f64(0.0, "bandwidth")        # bytes/s of the link (shared)
        self.dense_bw = f64(0.0, "dense_bw")          # ... as dense steps measured it
        self.flow = f64(0.0, "flow")                  # bytes sparse steps sent (smoothed, shared)
        self.fixed_s = f64(0.0, "fixed_s")            # a collective's fixed cost (the line's, last told)
        self.least_s = f64(0.0, "least_s")            # the least sparse link time (drifting up): fixed cost's bound
        # fading sums over sparse steps of 1, bytes, link s, bytes**2, bytes * link s (``line``)
        self.moments = [f64(0.0, f"fit_{name}") for name in ("w", "b", "l", "bb", "bl")]
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
        total = self.total.numpy()
        return {"dense": bool(self.dense.numpy() > 0.5), "price_nats": float(self.price.numpy()),
                "density": float(self.values.numpy() / total) if total else 0.0,  # this rank's, last step
                "bytes_per_element": float(self.sent.numpy() / total) if total else 0.0,
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
        per_element = lambda x: tf.math.divide_no_nan(x, self.total)
        figures = tf.cast(tf.stack([now - self.started, self.link_s, self.link_s ** 2, per_element(self.sent), valid,
                                    per_element(self.values), per_element(self.offered)]), tf.float32)
        self.measured_dense.assign(self.step_dense)
        self.step_dense.assign(self.dense)
        self.elements.assign(self.total)
        for var, value in ((self.started, now), (self.link_s, 0.0), (self.sent, 0.0), (self.values, 0.0),
                           (self.offered, 0.0), (self.total, 0.0)):
            var.assign(value)
        self.steps.assign_add(1.0)
        return self.dense > 0.5, figures

    def mode(self):
        """The running step's mode, for gradients after the first."""
        return self.step_dense > 0.5

    def count(self, sent, values, total, offered=None):
        """Adds a gradient's bytes sent (the compressor's count), values sent, values its
        selection rule offered before the density guards (default: those sent) and elements
        exchanged to this step's."""
        offered = values if offered is None else offered
        for var, x in ((self.sent, sent), (self.values, values), (self.offered, offered), (self.total, total)):
            var.assign_add(tf.cast(x, tf.float64))

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
        step_s, link_s, link_sq, share, valid, density, offer = tf.unstack(figures)
        # The rank that reached the collective last waited for nobody: its link time is the
        # link's. Two ranks' mean less their spread is exactly the lesser (a bound for more).
        link_s = link_s - tf.sqrt(tf.maximum(link_sq - link_s ** 2, 0.0))
        zero, link_s = tf.zeros([], tf.float64), tf.maximum(link_s, 1e-6)
        ok = valid > 0.5
        dense_step, sparse_step = ok & (self.measured_dense > 0.5), ok & (self.measured_dense < 0.5)
        dense_bytes = 4.0 * self.elements  # float32 values of a dense exchange
        sent_bytes = share * self.elements
        other = tf.maximum(step_s - link_s, 1e-4)
        other_s = self.smoothed(self.other_s, other, sparse_step)
        other_dense_s = self.smoothed(self.other_dense_s, other, dense_step)
        # each mode's non-link time, the other's until a step of its own measured it
        sparse_other = tf.where(other_s > 0.0, other_s, other_dense_s)
        # The target prices the step without what its own selection costs: a sparse step's
        # non-link time grows with what it sends (selection, coding, the ceiling's exact top-k),
        # and a target taken from that time would buy itself ever more bytes.
        base_s = tf.where(sparse_step, tf.where(self.base_s > 0.0, tf.minimum(other_s, LEAST_DRIFT * self.base_s),
                                                other_s), self.base_s)
        work = self.fitted(self.work, sparse_step, sent_bytes, other)
        work_s, work_rate = self.line(work)  # a step's non-link time without a payload, and its bytes/s
        base = tf.where(work_rate > 0.0, tf.minimum(work_s, sparse_other),
                        tf.where(base_s > 0.0, base_s, sparse_other))
        per_byte_s = tf.math.divide_no_nan(1.0, work_rate)
        dense_other = tf.where(other_dense_s > 0.0, other_dense_s, other_s)
        link = self.measured(dense_step, sparse_step, dense_bytes / link_s, sent_bytes, link_s)
        bandwidth = link["bandwidth"]
        byte_s = tf.math.divide_no_nan(1.0, bandwidth) + per_byte_s  # a sent byte's time, link and work
        # The price answers the bytes the rule offered, toward a target of at most the ceiling's:
        # at the ceiling the bytes sent no longer answer it, and a price that kept falling would
        # make nearly every element a candidate (each step then compacts and caps all of them).
        value_bytes = tf.math.divide_no_nan(share, density)
        target = tf.minimum(EXPONENT / (1 - EXPONENT) * tf.math.divide_no_nan(base, byte_s),
                            self.ceiling * self.elements * value_bytes)
        flow, price = self.priced(sparse_step, offer * self.elements * value_bytes, target)
        since = tf.where(sparse_step, self.since_dense_s + step_s, tf.where(dense_step, zero, self.since_dense_s))
        # A dense step (a probe too) is priced at what dense steps measured, the payloads'
        # estimate until there is one: small payloads' times are mostly fixed cost and noise,
        # and their fitted line read links 3x too fast and 30x too slow.
        measured_bw = link["dense_bw"]
        dense_s = dense_other + tf.math.divide_no_nan(dense_bytes, tf.where(measured_bw > 0.0, measured_bw, bandwidth))
        known = (sparse_other > 0.0) & (bandwidth > 0.0)
        dense = self.choose(sparse_other, dense_s, bandwidth, dense_bytes)
        probed = tf.where(dense_step, tf.ones([], tf.float64), self.probed)
        # A sparse link time under the step's other time says little of the bandwidth (it is
        # mostly fixed cost): the first probe then comes at once, if at the bandwidth so far it
        # costs no more than the probes' share of 20 steps, and the step now running is not
        # dense already (its figures come a step late).
        blind = (sparse_step & (probed < 0.5) & (self.step_dense < 0.5) & (link_s < sparse_other)
                 & (dense_s * PROBE_SHARE <= sparse_other))
        probe = known & ~dense & ((since * PROBE_SHARE >= dense_s) | blind)
        dense = tf.where(known, dense | probe, self.dense > 0.5)
        return tf.group(
            *(v.assign(x) for v, x in zip(self.moments, link.pop("moments"))),
            *(getattr(self, name).assign(value) for name, value in link.items()),
            self.other_s.assign(other_s), self.other_dense_s.assign(other_dense_s), self.flow.assign(flow),
            self.base_s.assign(base_s), *(v.assign(x) for v, x in zip(self.work, work)),
            self.price.assign(price), self.since_dense_s.assign(tf.where(probe, zero, since)),
            self.probed.assign(probed), self.dense.assign(tf.cast(dense, tf.float64)))

    def measured(self, dense_step, sparse_step, dense_bw, sent_bytes, link_s):
        """What the link is after a step: ``{moments, fixed_s, least_s, dense_bw, bandwidth}``.
        A dense step measures the bandwidth (``dense_bw``); the first sparse step gives a
        lower bound, its payload over its link time; later ones move the estimate
        ``FOLLOW`` of the way (in log) toward what they tell (``told``), never below their own
        lower bound. What dense steps measured (``dense_bw``, each moving it ``DENSE_FOLLOW``
        of the way in log: on an unshaped link one dense step read 40-410 MB/s) is kept apart:
        it prices a dense step, in the choice of mode and in the probes' schedule."""
        moments = self.fitted(self.moments, sparse_step, sent_bytes, link_s)
        fixed_s, least_s, told = self.told(moments, sent_bytes, link_s)
        old, lower = self.bandwidth, sent_bytes / link_s
        toward = moved(old, told, FOLLOW)
        sparse_bw = tf.where(old == 0.0, lower, tf.maximum(tf.where(told > 0.0, toward, old), lower))
        return {"moments": moments, "fixed_s": tf.where(sparse_step, fixed_s, self.fixed_s),
                "least_s": tf.where(sparse_step, least_s, self.least_s),
                "dense_bw": tf.where(dense_step, moved(self.dense_bw, dense_bw, DENSE_FOLLOW), self.dense_bw),
                "bandwidth": tf.where(dense_step, dense_bw, tf.where(sparse_step, sparse_bw, old))}

    def priced(self, sparse_step, offered_bytes, target_bytes):
        """The smoothed bytes the rule offered on sparse steps and the price after this step:
        moved by ``GAIN`` per e-fold of those bytes over ``target_bytes``, within
        ``[-PRICE_LIMIT, 0]``."""
        flow = tf.where(sparse_step, tf.where(self.flow > 0.0, FLOW_SMOOTHING * self.flow
                                              + (1 - FLOW_SMOOTHING) * offered_bytes, offered_bytes), self.flow)
        step = GAIN * tf.math.log(tf.math.divide_no_nan(flow, target_bytes))
        moves = sparse_step & (flow > 0.0) & (target_bytes > 0.0)
        return flow, tf.where(moves, tf.clip_by_value(self.price + step, -PRICE_LIMIT, 0.0), self.price)

    @staticmethod
    def smoothed(old, new, when):
        """``old`` moved toward ``new`` where ``when`` (a step-long pause, as an evaluation
        between two steps, counts as at most 4 ``old``)."""
        new = tf.where(old > 0.0, tf.minimum(new, 4.0 * old), new)
        return tf.where(when, tf.where(old > 0.0, SMOOTHING * old + (1 - SMOOTHING) * new, new), old)

    @staticmethod
    def fitted(moments, sparse_step, sent_bytes, seconds):
        """The fading ``moments`` of (bytes, seconds) over sparse steps, with this step's added."""
        point = tf.stack([tf.ones([], tf.float64), sent_bytes, seconds, sent_bytes ** 2, sent_bytes * seconds])
        old = tf.stack(moments)
        return tf.unstack(tf.where(sparse_step, FADING * old + point, old))

    def line(self, moments=None):
        """The least-squares line ``seconds = fixed + bytes / rate`` through the sparse steps
        (default: their link times): ``(fixed, rate)``; the rate is 0 while their bytes vary
        too little to tell what grows with them from what does not (or the fit is not rising)."""
        w, b, l, bb, bl = moments if moments is not None else self.moments
        mean_b, mean_l = tf.math.divide_no_nan(b, w), tf.math.divide_no_nan(l, w)
        var_b = tf.math.divide_no_nan(bb, w) - mean_b ** 2
        slope = tf.math.divide_no_nan(tf.math.divide_no_nan(bl, w) - mean_b * mean_l, var_b)
        told = (w >= FIT_STEPS) & (var_b >= (FIT_SPREAD * mean_b) ** 2) & (slope > 0.0)
        rate = tf.where(told, tf.math.divide_no_nan(1.0, slope), tf.zeros([], tf.float64))
        return tf.maximum(mean_l - tf.where(told, slope, 0.0) * mean_b, 0.0), rate

    def told(self, fit, sent_bytes, link_s):
        """What a sparse step tells of the link: ``(fixed_s, least_s, bandwidth)``. The fixed
        cost is the fitted line's when its bytes vary enough, else the last one (at first the
        least link time seen, ``least_s``, drifting up), and never above that least time; the
        bandwidth is the line's, else this payload's throughput beyond the fixed cost where it
        took at least that long of its own (a link that slowed under payloads of one size),
        else 0: nothing told."""
        fixed, fitted = self.line(fit)
        least = tf.where(self.least_s > 0.0, tf.minimum(link_s, LEAST_DRIFT * self.least_s), link_s)
        fixed = tf.minimum(tf.where(fitted > 0.0, fixed, tf.where(self.fixed_s > 0.0, self.fixed_s, least)), least)
        own = link_s - fixed
        payload = tf.where((own >= fixed) & (own > 0.0), sent_bytes / tf.maximum(own, 1e-9), 0.0)
        return fixed, least, tf.where(fitted > 0.0, fitted, payload)

    def choose(self, other_s, dense_step_s, bandwidth, dense_bytes):
        """Whether a dense step (``dense_step_s`` long: its own non-link time and the dense
        exchange) makes more progress per second than the best sparse one: ``1 / dense_step_s``
        against ``min(d / SATURATION, 1) ** g / (T + L)`` at the time-optimal link time
        ``L = g / (1 - g) * T`` (or the density ceiling, if that comes first)."""
        values_per_s = bandwidth / VALUE_BYTES
        elements = dense_bytes / 4.0
        link = EXPONENT / (1 - EXPONENT) * other_s
        density = tf.minimum(tf.math.divide_no_nan(link * values_per_s, elements), self.ceiling)
        link = tf.math.divide_no_nan(density * elements, values_per_s)
        progress = tf.minimum(density / SATURATION, 1.0) ** EXPONENT
        sparse_rate = tf.math.divide_no_nan(progress, other_s + link)
        return tf.math.divide_no_nan(1.0, dense_step_s) >= sparse_rate


def moved(old, new, share):
    """``old`` moved ``share`` of the log-distance toward ``new`` (``new`` itself while ``old`` is 0)."""
    return tf.where(old > 0.0, old * tf.math.divide_no_nan(new, old) ** share, new)
