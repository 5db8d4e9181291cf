"""One sparse step for every gradient of a group: the gradients end to end, one call.

Horovod's grouped path (``groups=``) hands ``compress`` every gradient of a group before the first
``decompress``; without groups each gradient is a group of one. A gradient's ``compress`` hands
Horovod its marker (on a dense step, the gradient with its residual's drain) and joins its
group's ``Batch``; the batch queues one ``exchange.Deferred`` payload, made when the group is
gathered by one step over its gradients laid end to end (``Layout``): residuals and gradients
concatenated, every gradient's plan from a sample at fixed positions in one compiled call
(``plan_all``), one pass that accumulates and marks each element against its own gradient's
thresholds (compiled from ``fused.XLA_MIN_ELEMENTS`` elements), one compaction, the guards of
the gradients over their ceiling or under their floor (a loop over those alone), one encoding of
positions among the group's elements, the residuals written back. Every rank decodes every
rank's payload once into one flat sum, which each ``decompress`` slices. Per gradient there
remain the reads and writes of its own variables; the rest is paid once per group.

A group whose accumulated values hold NaN or Inf (a loss scale that overflowed) sends a NaN at each
gradient's first element in place of its selection and keeps every residual and fit as they were:
every gradient of the group then decodes to a non-finite sum on every rank, so every rank's loss-scale optimizer skips
the same step (``sparse`` module doc).
"""
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hvd_gradpart import branch, exchange, formats, fused, metrics
from hvd_gradpart.memory import creating_slot_variables

_OWNERS = {}  # a layout's sizes -> the variable of ``Layout.owners`` (untracked: no checkpoint holds it)


class Layout:
    """Where each gradient of a batch sits in the flat buffer (static: traced once per group).

    Args:
        sizes: each gradient's number of elements, in joining order.
        sample_size: the elements sampled from each (``stats.fixed_sample``'s strides).
    """

    def __init__(self, sizes, sample_size):
        self.sizes = tuple(int(n) for n in sizes)
        self.offsets = tuple(int(o) for o in np.cumsum((0,) + self.sizes[:-1]))
        self.total = sum(self.sizes)
        positions = np.zeros([len(self.sizes), sample_size], np.int32)
        valid = np.zeros([len(self.sizes), sample_size], bool)
        for i, (n, offset) in enumerate(zip(self.sizes, self.offsets)):
            taken = np.arange(0, n, max(1, -(-n // sample_size)))[:sample_size]
            positions[i, :len(taken)], valid[i, :len(taken)] = offset + taken, True
        self.positions, self.valid = positions, valid

    def owners(self):
        """int32 ``[total]``: the gradient each element belongs to, read from a variable made
        once per layout (a gather from it broadcasts per-gradient figures, also in compiled
        code); None for one gradient."""
        if len(self.sizes) == 1:
            return None
        if self.sizes not in _OWNERS:
            with tf.init_scope(), creating_slot_variables():
                _OWNERS[self.sizes] = tf.Variable(np.repeat(np.arange(len(self.sizes), dtype=np.int32), self.sizes),
                                                  trainable=False, name="owners")
        return _OWNERS[self.sizes].read_value()

    def owner(self, indices):
        """The gradient each flat int32 index belongs to (int32)."""
        if len(self.sizes) == 1:
            return tf.zeros_like(indices)
        return tf.searchsorted(tf.constant(self.offsets[1:], tf.int32), indices, side="right")

    def count(self, indices):
        """How many of the flat ``indices`` each gradient holds, float64 ``[T]``."""
        ones = tf.ones_like(indices, tf.float64)
        return tf.math.unsorted_segment_sum(ones, self.owner(indices), len(self.sizes))

    def split(self, flat):
        """The flat buffer as one tensor per gradient."""
        return [flat] if len(self.sizes) == 1 else tf.split(flat, self.sizes)

    def concat(self, tensors):
        """Tensors, one per gradient, end to end."""
        return tensors[0] if len(tensors) == 1 else tf.concat(tensors, 0)


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
    counts: tf.Tensor    # [sent bytes, values sent, values offered, accumulated energy, least sent value squared]


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
        shown = ", ".join(m.what for m in self.members[:2])
        return f"{len(self.members)} gradient(s) sparsified together ({shown}{', ...' if len(self.members) > 2 else ''})"

    def mismatch(self):
        return (f"hvd_gradpart: ranks disagree on the {self.what()} under {type(self.compressor).__name__}"
                f"{self.compressor.settings()}: every rank must build the same model and the same compressor "
                "settings, and group gradients the same way")

    def payload(self):
        return self.step().payload

    def step(self):
        """The batch's ``Step``, made once (nothing is sent on a dense step)."""
        if self._step is None:
            layout, header = self.layout, self.header()
            opens = self.ticket.position == 0
            with tf.control_dependencies([m.grad for m in self.members]):
                began = tf.timestamp()
            if self.dense is None:
                payload, counts = self._sparse(layout, header, opens)
            else:
                payload, counts = branch.cond(self.dense, lambda: (tf.zeros([0], tf.uint8), tf.zeros([5], tf.float64)),
                                              lambda: self._sparse(layout, header, opens))
            with tf.control_dependencies([payload]):
                left = tf.timestamp()
            self._step = Step(payload, began, left, counts)
        return self._step

    def _sparse(self, layout, header, opens):
        """The sparse step: ``(payload, counts)``; the residuals, fits and metrics are stored.
        Only the selection and its encoding depend on the accumulated values being finite: the
        residuals' update runs in place on the sweep's buffer either way (nothing to update on a
        step that is not finite), so a lone gradient's residual takes that buffer over uncopied."""
        c, members = self.compressor, self.members
        slots = [m.slot for m in members]
        grad = layout.concat([m.grad for m in members])
        residual = layout.concat([slot.residual.value() for slot in slots])
        state = c.batch_state(slots)
        plan = c.plan_all(tf.gather(grad, layout.positions), tf.constant(layout.valid), state,
                          tf.constant(layout.sizes, tf.float64), tf.stack([m.price for m in members]))
        sweep = fused.by_size(c.batch_sweep, layout.total)
        acc, marked, energy = sweep(residual, grad, plan, layout.owners())
        candidates = fused.compact(marked)
        finite = fused.finite(acc, candidates)
        indices, payload, sent, form = branch.cond(
            finite, lambda: self._selected(layout, header, acc, candidates, state),
            lambda: self._unselected(layout, header))
        kept = layout.split(fused.subtract_at(acc, indices, sent))
        kept = branch.cond(finite, lambda: kept, lambda: [slot.residual.value() for slot in slots])
        stores = [slot.residual.assign(r, read_value=False) for slot, r in zip(slots, kept)]
        sent_bytes = tf.cast(exchange.sent_bytes(payload, opens), tf.float64)
        counts = layout.count(indices)
        recorded = branch.cond(finite, lambda: self._record(layout, counts, sent_bytes, form, c.stored_plan(plan, slots, state)),
                               lambda: self._record(layout, counts, sent_bytes, form, {}))
        offered = tf.where(finite, tf.cast(candidates.count, tf.float64), 0.0)
        least = tf.reduce_min(tf.square(tf.cast(sent, tf.float64)))  # +inf when nothing was sent (then unused)
        figures = tf.stack([sent_bytes, tf.cast(tf.size(indices), tf.float64), offered,
                            tf.cast(energy, tf.float64), least])
        with tf.control_dependencies(stores + [recorded]):
            return tf.identity(payload), figures

    def _selected(self, layout, header, acc, candidates, state):
        """The guarded selection of finite accumulated values: ``(indices, payload, sent values, format)``."""
        c = self.compressor
        indices = c.guard_all(acc, candidates, layout, state)
        encoded = exchange.encode(tf.gather(acc, indices), indices, layout.total, c.value_encoding, header,
                                  ascending=True)
        return indices, encoded.payload, encoded.sent, encoded.format

    def _unselected(self, layout, header):
        """A NaN at each gradient's first element in place of the selection (module doc), and no
        value sent."""
        dtype = self.members[0].grad.dtype
        nan = tf.fill([len(self.members)], tf.constant(float("nan"), dtype))
        encoded = exchange.encode(nan, tf.constant(layout.offsets, tf.int32), layout.total,
                                  self.compressor.value_encoding, header, ascending=True, form=formats.WORD_GAPS)
        return tf.zeros([0], tf.int32), encoded.payload, tf.zeros([0], dtype), encoded.format

    def _record(self, layout, counts, sent, form, diagnostics):
        """Each gradient's metrics: its values, and the payload's bytes shared by values (the
        first gradient takes a payload that carries none); returns a value once written."""
        total = tf.reduce_sum(counts)
        first = tf.one_hot(0, len(self.members), dtype=tf.float64)
        share = tf.where(total > 0, counts / tf.maximum(total, 1.0), first)
        n = tf.constant(layout.sizes, tf.float64)
        size = self.members[0].grad.dtype.size
        writes = metrics.record_each([m.slot.metrics.figures for m in self.members], elements=n,
                                     dense_bytes=n * size, sent_elements=counts, sent_bytes=sent * share,
                                     wire_format=form, **diagnostics)
        with tf.control_dependencies(writes):
            return tf.constant(True)

    def total(self, scale):
        """Every rank's payload decoded once into the flat sum over the group, times ``scale``
        (empty on a dense step)."""
        if self._total is None:
            self.step()
            n, dtype, payloads = self.layout.total, self.members[0].grad.dtype, self.ticket.payloads()
            decode = lambda: exchange.decode_sum(payloads, n, dtype, self.compressor.value_encoding, scale,
                                                 self.mismatch())
            self._total = decode() if self.dense is None else branch.cond(
                self.dense, lambda: tf.zeros([0], dtype), decode)
            if self.budget is not None:
                self._stamp()
        return self._total

    def _stamp(self):
        """The budget's stamps of the group, one row (``budget.Budget.left``), once its sum is in hand."""
        members, step = self.members, self._step
        n = float(self.layout.total)
        dense_counts = tf.constant([n * 4.0, n, n, 0.0, 0.0], tf.float64)
        began = tf.where(self.dense, tf.reduce_min(tf.stack([m.began for m in members])), step.began)
        left = tf.where(self.dense, tf.reduce_max(tf.stack([m.left for m in members])), step.left)
        counts = tf.where(self.dense, dense_counts, step.counts)
        stamps = self.budget.stamps_of(members[0].slot.key, self.layout.total)
        self._total = self.budget.held(stamps, began, left, counts, self.dense, self.layout.total, self._total)

    def share(self, position, reduced, tail):
        """Gradient ``position``'s flat sum: its values in Horovod's ``reduced`` tensor (a dense
        step) or its slice of the group's decoded sum."""
        offset, n = self.layout.offsets[position], self.layout.sizes[position]
        share = self.total(exchange.marker_scale(reduced[-tail:][:1]))[offset:offset + n]
        if self.dense is None:
            return share
        return branch.cond(self.dense, lambda: reduced[:n], lambda: share)
