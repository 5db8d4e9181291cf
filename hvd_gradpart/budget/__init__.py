"""Link budget: how much of a gradient a step sends, priced in wall-clock time.

GradPart's entropy rule decides *which* values are worth sending; the budget decides *how
many*, from what the running job measures, and whether a step hands Horovod the whole
gradient instead. Its parts: ``clock`` (a step's time and exposed link time), ``bandwidth``
(a sent value's link and step time, a dense step's), ``price`` (the objective: the values
sent cost the share of a step that minimises steps times step time), ``mode`` (dense or
sparse, with hysteresis), ``controller`` (their state and the one update), ``config``.

One writer, so Horovod's per-gradient conds stay apart: a gradient's branch (or a group's,
whose gradients are sent together) writes only its own stamps (one ``Stamp`` row: this rank's
times and ``Counts``, one small variable) and the first gradient's branch alone writes the
figures its marker brought back. Everything the graph reads of the budget (``Now``: mode,
price, the figures the first marker carries) is one value computed at call time, before the
step runs (``capture_call_time_value``): this rank's figures of the last step from every
stamp, and the controller's update from the
shared figures of the step before. Every rank folds the same shared figures, so every
rank takes the same mode on the same step; a step some rank did not carry valid figures of
(its time unknown, or a gradient that was not finite: a step the optimizer skipped) is not
folded. Outside a traced function nothing is measured.
"""
import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hvd_gradpart.budget import clock, controller
from hvd_gradpart.budget.config import DEFAULT, Config
from hvd_gradpart.memory import creating_slot_variables, function_graph

Stamp, Counts = clock.Stamp, clock.Counts
STAMPS = len(Stamp._fields)  # a stamps row
FIGURES = len(clock.CARRIED)  # what the first marker carries (``clock.carried``)
ALL_VALID = 0.999  # the mean over ranks of the carried "valid" flags when every rank's is 1


class Now(NamedTuple):
    """The call-time value of a step being traced (``Budget.now``)."""

    dense: tf.Tensor    # bool: this step hands Horovod every gradient
    price: tf.Tensor    # float64 nats a sent value costs (the controller's price)
    scope: tf.Tensor    # float64 log of the elements the step's gradients hold
    figures: tf.Tensor  # float64 ``[FIGURES]``: this rank's figures of the last step, for the first marker


HEAD = len(Now._fields) - 1  # the call-time value's scalars before the figures

__all__ = ["Budget", "Config", "Counts", "DEFAULT", "FIGURES", "Now", "STAMPS", "Stamp"]


class Budget(tf.Module):
    """The link controller of one training step (one model).

    Args:
        config: ``Config``; the defaults are the tested ones.
    """

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {
        "_first", "_calls", "_last_began", "_step", "_collect"}

    def __init__(self, config=DEFAULT):
        super().__init__(name="budget")
        self.config = config
        with tf.init_scope(), creating_slot_variables():
            self.state = tf.Variable(tf.constant(controller.State().vector(), tf.float64), trainable=False,
                                     name="state")
            self.shared = tf.Variable(tf.zeros([FIGURES], tf.float64), trainable=False, name="shared")
        self.stamps = {}  # slot key -> its stamps variable
        self.elements = {}  # slot key -> its gradient's elements
        self._first = weakref.WeakKeyDictionary()  # graph -> the key of its first gradient
        self._calls = weakref.WeakKeyDictionary()  # graph -> its call-time value
        self._last_began, self._step, self._collect = 0.0, 0, None

    def restart(self):
        """Back to the state at creation, so every figure is measured again (elastic training
        calls it when the set of ranks, and with it the links, changed)."""
        self.state.assign(controller.State().vector())
        self.shared.assign(tf.zeros([FIGURES], tf.float64))
        for stamps in self.stamps.values():
            stamps.assign(tf.zeros([STAMPS], tf.float64))
        self._last_began, self._step = 0.0, 0

    def read(self):
        """The controller's state as a dict of Python values (for logs), with this rank's
        density and bytes per element of its last step."""
        rows = [Stamp(*s.numpy()) for s in self.stamps.values()]
        elements = sum(r.elements for r in rows)
        local = {"density": sum(r.values for r in rows) / elements if elements else 0.0,
                 "bytes_per_element": sum(r.sent_bytes for r in rows) / elements if elements else 0.0}
        return {**controller.report(controller.State.of(self.state.numpy()), self.config), **local}

    # At call time (eager, before each run of the traced step) ------------------------------

    def _at_call(self):
        """``[dense, price, log N, *figures]``: this step's mode and price, the log of the
        elements its gradients hold, and this rank's figures of the last step, which the first
        marker carries."""
        figures = np.zeros([FIGURES])
        if self.stamps:
            if self._collect is None or len(self._collect.variables) != len(self.stamps):
                self._collect = _Collector(list(self.stamps.values()))
            raw = [row for row in self._collect().numpy() if row[0] > 0.0]
            if raw:
                began, f = clock.step_figures(raw, self._last_began)
                if began > self._last_began:
                    # step ids go on from a restored checkpoint's (every rank restores the same)
                    self._step = max(self._step, round(self.shared.numpy()[1])) + 1
                    self._last_began = began
                    figures = np.array(clock.carried(self._step, f))
        state = controller.State.of(self.state.numpy())
        shared = self.shared.numpy()
        if shared[0] > ALL_VALID and shared[1] > state.step_id:
            state = controller.update(state, clock.shared_figures(shared.tolist()), self.config)
            self.state.assign(state.vector())
        scope = np.log(max(sum(self.elements.values()), 1))
        return tf.constant([state.dense, state.price, scope, *figures], tf.float64)

    # While tracing (called by the compressor) ------------------------------------------------

    def now(self):
        """``Now``: the call-time value of the step being traced (``_at_call``)."""
        graph = function_graph()
        if graph not in self._calls:
            self._calls[graph] = graph.capture_call_time_value(
                self._at_call, tf.TensorSpec([HEAD + FIGURES], tf.float64), key=("hvd_gradpart.budget", id(self)),
                default_value=tf.constant([0.0] * (HEAD + FIGURES), tf.float64))
        value = self._calls[graph]
        return Now(value[0] > 0.5, value[1], value[2], value[HEAD:])

    def first(self, graph, key):
        """Whether the gradient ``key`` is the first ``graph`` traced (its marker carries the figures)."""
        return self._first.setdefault(graph, key) == key

    def stamps_of(self, key, elements=None):
        """The stamps variable of gradient ``key``, made on first use (``elements``: its size,
        counted in the step's while tracing)."""
        if elements is not None:
            self.elements[key] = elements
        if key not in self.stamps:
            with tf.init_scope(), creating_slot_variables():
                self.stamps[key] = tf.Variable(tf.zeros([STAMPS], tf.float64), trainable=False,
                                               name=f"stamps_{len(self.stamps)}")
        return self.stamps[key]

    @staticmethod
    def left(stamps, began, after, counts, dense, elements):
        """A ``compress`` ended once ``after`` exists: stamps its times and ``counts`` (sent
        bytes, values, offered, accumulated energy, least value squared) into its
        gradient's ``stamps`` variable (``stamps_of``). Returns ``after``."""
        with tf.control_dependencies(tf.nest.flatten(after)):
            left = tf.timestamp()
        return _stamped(stamps, [began, left, tf.zeros([], tf.float64)], counts, dense, elements, after)

    @staticmethod
    def held(stamps, began, left, counts, dense, elements, after):
        """Gradients whose ``compress`` work ran from ``began`` to ``left`` have their sum once
        ``after`` exists: stamps the three times and ``counts`` (as ``left``) into one
        ``stamps`` variable. Returns ``after``."""
        with tf.control_dependencies(tf.nest.flatten(after)):
            arrived = tf.timestamp()
        return _stamped(stamps, [began, left, arrived], counts, dense, elements, after)

    def arrived(self, key, reduced):
        """A ``decompress`` of gradient ``key`` starts with ``reduced`` in hand; returns it."""
        with tf.control_dependencies(tf.nest.flatten(reduced)):
            arrived = Stamp._fields.index("arrived")
            stamp = self.stamps_of(key).scatter_nd_update([[arrived]], tf.reshape(tf.timestamp(), [1]))
        with tf.control_dependencies([stamp]):
            return tf.nest.map_structure(tf.identity, reduced)

    def brought(self, reduced_figures, marker):
        """The first gradient's ``decompress``: keeps the figures its marker brought back, the
        means over ranks (``reduced_figures / marker`` undoes Sum, Average and any scaling).
        Returns the op."""
        figures = tf.cast(reduced_figures, tf.float64) / tf.cast(marker, tf.float64)
        return self.shared.assign(tf.reshape(figures, [FIGURES]), read_value=False)


def _stamped(stamps, times, counts, dense, elements, after):
    """Writes one ``Stamp`` row: the three times, the ``Counts`` (a float64 ``[5]`` tensor), the
    elements and the mode; returns ``after`` once it is written."""
    began, left, arrived = times
    counts = Counts(*tf.unstack(counts))
    row = tf.stack(Stamp(began, left, arrived, counts.sent_bytes, counts.values, counts.offered,
                         tf.cast(elements, tf.float64), counts.energy, counts.least, tf.cast(dense, tf.float64)))
    stamp = stamps.assign(row, read_value=False)
    with tf.control_dependencies([stamp]):
        return tf.nest.map_structure(tf.identity, after)


class _Collector:
    """Every gradient's stamps in one array, read by one compiled call."""

    def __init__(self, variables):
        self.variables = variables
        self._read = tf.function(lambda: tf.stack([v.read_value() for v in variables]))

    def __call__(self):
        return self._read()
