"""One sparse step for every gradient of a group: the gradients end to end, one call.

Horovod's grouped path (``groups=``) hands ``compress`` every gradient of a group before the first
``decompress``; without groups each gradient is a group of one. A gradient's ``compress`` hands
Horovod its marker (on a dense step, the gradient with its residual's drain) and joins its
group's ``Batch``; the batch queues one ``exchange.Deferred`` payload, made when the group is
gathered by one step over its gradients laid end to end (``Layout``, ``sparse_step``): residuals
and gradients concatenated, every gradient's plan from a sample at its own strided positions in
one compiled call (``plan_all``), one pass that accumulates and marks each element against its
own gradient's thresholds (compiled from ``fused.XLA_MIN_ELEMENTS`` elements), one compaction,
the guards of the gradients over their ceiling (one sort) or under their floor (a loop over
those alone), one encoding of positions among the group's elements, the residuals written back.
Every rank decodes every rank's payload once into one flat sum, which each ``decompress``
slices. Per gradient there remain the reads and writes of its own variables; the rest is paid
once per group. The step is one function called, not inlined: traced once per group of several,
and once for every lone gradient of a compressor (its size read as the graph runs), so Horovod's
per-tensor path does not grow the graph with the model's gradients.

A group whose accumulated values hold NaN or Inf (a loss scale that overflowed) sends a NaN at
each gradient's first element in place of its selection and keeps every residual and fit as they
were: every gradient of the group then decodes to a non-finite sum on every rank, so every
rank's loss-scale optimizer skips the same step (``sparse`` module doc).
"""
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hvd_gradpart import branch, exchange, formats, fused, metrics, stats
from hvd_gradpart.budget import Counts
from hvd_gradpart.memory import creating_slot_variables

_OWNERS = {}  # a layout's sizes -> the variable of ``Layout.owners`` (untracked: no checkpoint holds it)


class Layout:
    """Where each gradient of a batch sits in the flat buffer. A batch of several is traced once per
    group (static sizes); a lone gradient's layout, ``sizes`` ``(None,)``, reads its size as the
    graph runs, so every lone gradient of a compressor shares one trace.

    Args:
        sizes: each gradient's number of elements, in joining order, or ``(None,)``.
        sample_size: the elements sampled from each (``stats.fixed_sample``'s strides).
    """

    def __init__(self, sizes, sample_size):
        self.sizes = (None,) if len(sizes) == 1 else tuple(int(n) for n in sizes)
        self.sample_size = sample_size
        self.offsets = (0,) if len(sizes) == 1 else tuple(int(o) for o in np.cumsum((0,) + self.sizes[:-1]))

    @property
    def lone(self):
        """Whether the batch holds one gradient (its size read as the graph runs)."""
        return self.sizes == (None,)

    def total(self, flat):
        """The elements of the flat buffer ``flat``: an int, or an int32 tensor for a lone gradient."""
        return tf.size(flat) if self.lone else sum(self.sizes)

    def elements(self, flat):
        """Each gradient's elements, float64 ``[T]``."""
        return tf.cast(tf.size(flat), tf.float64)[None] if self.lone else tf.constant(self.sizes, tf.float64)

    def sample(self, flat):
        """``stats.fixed_sample`` of each gradient of the flat buffer: ``[T, sample_size]`` values
        and their bool mask, the strided positions of each gradient's own sample."""
        if self.lone:
            sample, valid = stats.fixed_sample(flat, self.sample_size)
            return sample[None], valid[None]
        positions = np.zeros([len(self.sizes), self.sample_size], np.int32)
        valid = np.zeros([len(self.sizes), self.sample_size], bool)
        for i, (n, offset) in enumerate(zip(self.sizes, self.offsets)):
            taken = np.arange(0, n, max(1, -(-n // self.sample_size)))[:self.sample_size]
            positions[i, :len(taken)], valid[i, :len(taken)] = offset + taken, True
        return tf.gather(flat, positions), tf.constant(valid)

    def owners(self):
        """int32 ``[total]``: the gradient each element belongs to, read from a variable made
        once per layout (a gather from it broadcasts per-gradient figures, also in compiled
        code); None for a lone gradient."""
        if self.lone:
            return None
        if self.sizes not in _OWNERS:
            with tf.init_scope(), creating_slot_variables():
                _OWNERS[self.sizes] = tf.Variable(np.repeat(np.arange(len(self.sizes), dtype=np.int32), self.sizes),
                                                  trainable=False, name="owners")
        return _OWNERS[self.sizes].read_value()

    def owner(self, indices):
        """The gradient each flat int32 index belongs to (int32)."""
        if self.lone:
            return tf.zeros_like(indices)
        return tf.searchsorted(tf.constant(self.offsets[1:], tf.int32), indices, side="right")

    def count(self, indices):
        """How many of the flat ``indices`` each gradient holds, float64 ``[T]``."""
        ones = tf.ones_like(indices, tf.float64)
        return tf.math.unsorted_segment_sum(ones, self.owner(indices), len(self.sizes))

    def piece(self, flat, i):
        """Gradient ``i``'s slice of the flat buffer ``flat`` (all of it for a lone gradient)."""
        return flat if self.lone else flat[self.offsets[i]:self.offsets[i] + self.sizes[i]]

    def bounds(self, flat):
        """int32 ``[T]`` offsets and sizes of the gradients in the flat buffer ``flat``."""
        if self.lone:
            return tf.zeros([1], tf.int32), tf.size(flat)[None]
        return tf.constant(self.offsets, tf.int32), tf.constant(self.sizes, tf.int32)

    def split(self, flat):
        """The flat buffer as one tensor per gradient."""
        return [flat] if self.lone else tf.split(flat, self.sizes)

    def concat(self, tensors):
        """Tensors, one per gradient, end to end."""
        return tensors[0] if self.lone else tf.concat(tensors, 0)


class Member(NamedTuple):
    """A gradient that joined a batch."""

    slot: object        # its ``memory.Slot``
    grad: tf.Tensor     # flat, as handed
    header: int         # its payload header's digest, were it sent alone
    what: str           # as named in errors
    price: tf.Tensor    # float64 nats a sent value costs beyond its position in its tensor
    began: tf.Tensor    # float64 timestamp once the gradient was in hand
    left: tf.Tensor     # float64 timestamp once its ``compress`` output was


class Joined(NamedTuple):
    """What ``compress`` hands ``decompress`` for a gradient in a batch."""

    batch: "Batch"
    position: int              # its place in the batch
    original: tf.Tensor        # the gradient as Horovod handed it (shape, dtype)
    context: object            # its ``Context`` (the hand-over to a momentum optimizer)
    first: bool                # its marker carries the budget's figures
    tail: int                  # elements of its marker (and the figures) after its values


class Step(NamedTuple):
    """What a batch's sparse step leaves for ``decompress`` (float64 figures)."""

    payload: tf.Tensor   # flat uint8
    began: tf.Tensor     # timestamp once the gradients were in hand
    left: tf.Tensor      # timestamp once the payload was
    counts: tf.Tensor    # float64 ``budget.Counts``


class Batch(exchange.Deferred):
    """The gradients of one compressor in one group, and their one payload.

    Args:
        compressor: the ``GradPartCompressor`` whose step runs (``batch_state``, ``plan_all``,
            ``batch_sweep``, ``guard_all``, ``stored_plan``).
        dense: bool tensor, this step hands Horovod every gradient (None: never).
        budget: the step's ``budget.Budget`` (None: not following the link).
    """

    def __init__(self, compressor, dense, budget):
        self.compressor, self.dense, self.budget = compressor, dense, budget
        self.members = []
        self.ticket = exchange.enqueue(self, None, None, skip=dense)
        self._step = self._total = None

    def sent(self):
        """Whether the batch's payload was made (a gradient then opens a new batch)."""
        return self._step is not None

    def join(self, member):
        """Adds ``member``; returns its position."""
        if self._step is not None:
            raise RuntimeError("hvd_gradpart: a gradient joined a batch already sent")
        self.members.append(member)
        return len(self.members) - 1

    @property
    def layout(self):
        return Layout([m.grad.shape.num_elements() for m in self.members], self.compressor.research.sample_size)

    def header(self):
        return exchange.digest(repr([m.header for m in self.members]))

    def what(self):
        shown = ", ".join(m.what for m in self.members[:2]) + (", ..." if len(self.members) > 2 else "")
        return f"{len(self.members)} gradient(s) sparsified together ({shown})"

    def mismatch(self):
        return (f"hvd_gradpart: ranks disagree on the {self.what()} under {type(self.compressor).__name__}"
                f"{self.compressor.settings()}: every rank must build the same model and the same compressor "
                "settings, and group gradients the same way")

    def payload(self):
        return self.step().payload

    def step(self):
        """The batch's ``Step``, made once (nothing is sent on a dense step)."""
        if self._step is None:
            c, members = self.compressor, self.members
            with tf.control_dependencies([m.grad for m in members]):
                began = tf.timestamp()
            slots = [m.slot for m in members]
            dense = c.unfolded(False) if self.dense is None else self.dense
            payload, counts = _shared_step(
                c, self.layout.sizes, dense, [m.grad for m in members], [s.residual.handle for s in slots],
                [dict(s.state) for s in slots], [s.metrics.figures for s in slots], [m.price for m in members],
                c.unfolded(self.header()), c.unfolded(self.ticket.position == 0))
            with tf.control_dependencies([payload]):
                left = tf.timestamp()
            self._step = Step(payload, began, left, counts)
        return self._step

    def share(self, position, reduced, tail):
        """Gradient ``position``'s flat sum: its values in Horovod's ``reduced`` tensor (a dense
        step) or its share of the group's decoded sum, which every rank's payload is decoded into
        once (``BaseCompressor._shared_decode``)."""
        c, layout, dtype = self.compressor, self.layout, self.members[0].grad.dtype
        n = self.members[position].grad.shape.num_elements()
        if self._total is None:
            self.step()
            dense = c.unfolded(False) if self.dense is None else self.dense
            values = reduced[:tf.size(reduced) - tail] if layout.lone else tf.zeros([0], dtype)
            self._total = c._shared_decode(  # noqa: SLF001
                self.ticket.payloads(), exchange.marker_scale(reduced[-tail:][:1]), dense, values,
                c.unfolded(sum(m.grad.shape.num_elements() for m in self.members)), dtype, c.value_encoding,
                c.unfolded(self.mismatch()))
            if self.budget is not None:
                self._stamp()
        if layout.lone or self.dense is None:
            return layout.piece(self._total, position)
        return branch.cond(self.dense, lambda: reduced[:n], lambda: layout.piece(self._total, position))

    def _stamp(self):
        """The budget's stamps of the group, one row (``budget.Budget.held``), once its sum is in hand."""
        members, step = self.members, self._step
        n = sum(m.grad.shape.num_elements() for m in members)
        dense_counts = tf.constant(Counts(sent_bytes=n * 4.0, values=n, offered=n, energy=0.0, least=0.0), tf.float64)
        began = tf.where(self.dense, tf.reduce_min(tf.stack([m.began for m in members])), step.began)
        left = tf.where(self.dense, tf.reduce_max(tf.stack([m.left for m in members])), step.left)
        counts = tf.where(self.dense, dense_counts, step.counts)
        stamps = self.budget.stamps_of(members[0].slot.key, n)
        self._total = self.budget.held(stamps, began, left, counts, self.dense, n, self._total)


@tf.function(autograph=False, reduce_retracing=True, experimental_attributes={"_noinline": True})
def _shared_step(compressor, sizes, dense, grads, *args):
    """``sparse_step``, or nothing on a ``dense`` step, as one function per ``Layout``'s sizes: one
    for every lone gradient of a compressor (its size read as the graph runs), one per group of
    several."""
    layout = Layout(sizes, compressor.research.sample_size)
    return branch.cond(dense, lambda: (tf.zeros([0], tf.uint8), tf.zeros([len(Counts._fields)], tf.float64)),
                       lambda: sparse_step(compressor, layout, grads, *args))


def sparse_step(c, layout, grads, residuals, states, figures, prices, header, opens):
    """A batch's sparse step: ``(payload, counts)``; the residuals, predictions and metrics are stored.
    Only the selection and its encoding depend on the accumulated values being finite: the
    residuals' update runs in place on the sweep's buffer either way (nothing is sent on a step
    that is not finite), so a lone gradient's residual takes that buffer over uncopied.

    Args:
        c: the ``GradPartCompressor``.
        layout: the batch's ``Layout``.
        grads: the gradients, flat.
        residuals: their residual variables' handles (a handle's spec does not hold the
            variable's shape, so one trace serves a lone gradient of any size).
        states: their method state (``{name: variable}``).
        figures: their ``metrics.Figures``.
        prices: float64 nats a sent value costs beyond its position in its tensor, each.
        header: int32 digest the payload's header carries.
        opens: bool, the payload opens its group (and carries the group's tag).
    """
    grad = layout.concat(grads)
    residual = layout.concat(_read(residuals, grads))
    state = c.batch_state(states)
    plan = c.plan_all(*layout.sample(grad), state, layout.elements(grad), tf.stack(prices))
    acc, marked, energy = fused.by_size(c.batch_sweep, None if layout.lone else layout.total(grad))(
        residual, grad, plan, layout.owners())
    candidates = fused.compact(marked)
    finite = fused.finite(acc, candidates)
    indices, payload, sent, form = branch.cond(
        finite, lambda: _selected(c, layout, acc, candidates, state, header),
        lambda: _unselected(c, layout, acc, header))
    kept = layout.split(fused.subtract_at(acc, indices, sent))
    kept = branch.cond(finite, lambda: kept, lambda: _read(residuals, grads))
    stores = [tf.raw_ops.AssignVariableOp(resource=r, value=k) for r, k in zip(residuals, kept)]
    sent_bytes = tf.cast(exchange.sent_bytes(payload, opens), tf.float64)
    counts = layout.count(indices)
    n = layout.elements(grad)
    recorded = branch.cond(
        finite, lambda: _record(figures, n, grad.dtype, counts, sent_bytes, form, c.stored_plan(plan, states, state)),
        lambda: _record(figures, n, grad.dtype, counts, sent_bytes, form, {}))
    offered = tf.where(finite, tf.cast(candidates.count, tf.float64), 0.0)
    least = tf.reduce_min(tf.square(tf.cast(sent, tf.float64)))  # +inf when nothing was sent (then unused)
    counts = tf.stack(Counts(sent_bytes, tf.cast(tf.size(indices), tf.float64), offered, tf.cast(energy, tf.float64),
                             least))
    with tf.control_dependencies(stores + [recorded]):
        return tf.identity(payload), counts


def _read(handles, grads):
    """The residuals' values, of their gradients' static shapes: a handle's static shape is the
    one of the variable the step was traced with, not of the one it is called with (the slice,
    the whole of it, drops it)."""
    return [tf.raw_ops.ReadVariableOp(resource=h, dtype=g.dtype)[:tf.size(g)] for h, g in zip(handles, grads)]


def _selected(c, layout, acc, candidates, state, header):
    """The guarded selection of finite accumulated values: ``(indices, payload, sent values, format)``."""
    indices = c.guard_all(acc, candidates, layout, state.steps)
    encoded = exchange.encode(tf.gather(acc, indices), indices, layout.total(acc), c.value_encoding, header,
                              ascending=True)
    return indices, encoded.payload, encoded.sent, encoded.format


def _unselected(c, layout, acc, header):
    """A NaN at each gradient's first element in place of the selection (module doc), and no value sent."""
    offsets, _ = layout.bounds(acc)
    nan = tf.fill(tf.shape(offsets), tf.constant(float("nan"), acc.dtype))
    encoded = exchange.encode(nan, offsets, layout.total(acc), c.value_encoding, header, ascending=True,
                              form=formats.WORD_GAPS)
    return tf.zeros([0], tf.int32), encoded.payload, tf.zeros([0], acc.dtype), encoded.format


def _record(figures, n, dtype, counts, sent, form, diagnostics):
    """Each gradient's metrics: its values, and the payload's bytes shared by values (the first
    gradient takes a payload that carries none); returns a value once written."""
    total = tf.reduce_sum(counts)
    first = tf.one_hot(0, len(figures), dtype=tf.float64)
    share = tf.where(total > 0, counts / tf.maximum(total, 1.0), first)
    writes = metrics.record_each(figures, elements=n, dense_bytes=n * dtype.size, sent_elements=counts,
                                 sent_bytes=sent * share, wire_format=form, **diagnostics)
    with tf.control_dependencies(writes):
        return tf.constant(True)
