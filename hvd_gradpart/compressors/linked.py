"""A sparse method that follows the link: its step's size and mode come from ``hvd_gradpart.budget``.

On top of the shared exchange, each gradient's ``compress`` asks the budget's call-time
value for the step's mode: sparse (the selection rule, with the budget's price added to its
position costs) or dense (the gradient, with ``config.drain`` of its residual flushed in,
handed to Horovod's allreduce with its marker). The first gradient's marker also carries
this rank's figures of the last step, and its ``decompress`` keeps what came back (the
means over ranks). A spectral key area's factors travel inside ``compress`` (their link time
counts in the step's own work); a gradient that sends
nothing but its key area this step (``quiet``) skips the gather (when every payload of the
group does) and the decoding. Each gradient stamps its own times and counts. Nothing here
writes a variable that another gradient's branch touches.
"""
import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hvd_gradpart import branch, exchange, metrics
from hvd_gradpart.budget import FIGURES, Budget, Counts, Stamp
from hvd_gradpart.compressors import batch as batch_step
from hvd_gradpart.compressors.base import Context, _OnDefaultInstance, elements
from hvd_gradpart.compressors.sparse import SlotView, SparseCompressor, view_grad
from hvd_gradpart.memory import called_at_call_time, function_graph


class LinkContext(NamedTuple):
    """What ``compress`` hands ``decompress`` for a gradient whose step follows the link."""

    context: Context  # as for any sparse gradient
    budget: Budget    # the step's budget
    key: str          # the gradient's slot key
    dense: tf.Tensor  # bool: this step hands Horovod the gradient
    first: bool       # its marker carries the step's figures
    quiet: tf.Tensor = None  # bool: this step sent nothing of it but its spectral key area (None: never)


class LinkAwareCompressor(SparseCompressor):
    """``SparseCompressor`` whose step follows the link (one ``Budget`` per model's step).

    Args:
        follow_link: False keeps every step sparse at the selection rule's own density
            (no price, never dense).
        **kwargs: see ``SparseCompressor``.
    """

    _TF_MODULE_IGNORED_PROPERTIES = SparseCompressor._TF_MODULE_IGNORED_PROPERTIES | {"_batches"}

    def __init__(self, follow_link=True, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(follow_link, bool):
            raise ValueError(f"follow_link must be True or False, got {follow_link!r}; leave it out for the "
                             "default True (in a KEY=VALUE option: follow_link=false)")
        self.follow_link = follow_link
        self.budgets = {}  # one link budget per model's step (the slot keys' prefix)
        self._batches = weakref.WeakKeyDictionary()  # exchange.Group -> its batch of this compressor

    def link_budget(self, slot):
        """The budget of the step ``slot`` belongs to, made on first use; None when not
        following the link, outside a traced function, or where the budget's call-time value
        cannot reach (``memory.called_at_call_time``)."""
        if not self.follows(function_graph()):
            return None
        step = slot.key.rsplit("/", 1)[0]
        if step not in self.budgets:
            with tf.init_scope():
                self.budgets[step] = Budget()
        return self.budgets[step]

    def follows(self, graph):
        """Whether a step traced in ``graph`` follows the link (else it stays sparse at the rule's
        own density: eager, or traced where no call-time value reaches)."""
        return self.follow_link and graph is not None and called_at_call_time()

    def price(self, slot):
        """The nats a sent value of ``slot`` costs beyond its position in its own tensor
        (float64; 0 when not following the link): the link's price, and the log of the step's
        elements over the tensor's, so a position is named among the whole model's and a value
        is worth the same in a small tensor as in a large one."""
        budget = self.link_budget(slot)
        if budget is None:
            return tf.constant(0.0, tf.float64)
        now = budget.now()
        return now.price + now.scope - np.log(slot.residual.shape.num_elements())

    def least_sent(self, slot):
        """The least value ``slot``'s gradient sent on its last step, squared (float64): the
        marginal value at the link's price; 0 when not following the link, before a step,
        after a dense one or one that sent no value."""
        budget = self.link_budget(slot)
        if budget is None:
            return tf.constant(0.0, tf.float64)
        least = Stamp(*tf.unstack(budget.stamps_of(slot.key).read_value())).least
        return tf.where(tf.math.is_finite(least), least, 0.0)

    def batches(self, tensor):
        """Whether ``tensor`` joins its group's ``batch.Batch`` (a subclass that can says so)."""
        return False

    def _compress(self, tensor):
        """As ``SparseCompressor._compress``, or the gradient itself on a dense step; a gradient
        that ``batches`` joins its group's batch."""
        if self.batches(tensor):
            return self._join(tensor)
        graph = function_graph()
        if not self.follows(graph) or tensor.dtype != exchange.MARKER_DTYPE:
            return super()._compress(tensor)
        slot = self.memory.slot(tensor, self.state_spec())
        budget = self.link_budget(slot)
        now, first = budget.now(), budget.first(graph, slot.key)
        dense = now.dense
        described = self.describe(tensor, slot)
        grad = tf.reshape(tensor, [-1])
        with tf.control_dependencies([grad]):
            began = tf.timestamp()
        split = self.split(slot, tensor, grad)
        tail = exchange.marker()
        if first:
            tail = tf.concat([tail, tf.cast(now.figures, exchange.MARKER_DTYPE)], 0)
        view = self.slot_view(slot, grad, split)
        values, payload, residual = self._shared_step(
            view, view_grad(grad, split), dense, began, budget.stamps_of(slot.key, tensor.shape.num_elements()),
            budget.config.drain,
            self.unfolded(described.header), self.opens_group())
        slot.residual.assign(residual, read_value=False)
        self.after_split(slot, split)
        skip = dense if view.quiet is None else dense | view.quiet
        ticket = exchange.enqueue(payload, described.header, described.what, skip=skip)
        context = self.context(ticket, tensor, slot, described, split)
        return tf.concat([values, tail], 0), LinkContext(context, budget, slot.key, dense, first, view.quiet)

    def _join(self, tensor):
        """``(marker, or the gradient on a dense step, batch.Joined)``: the gradient joins its
        group's batch, which sends it with the others (``hvd_gradpart.compressors.batch``)."""
        graph = function_graph()
        slot = self.memory.slot(tensor, self.state_spec())
        slot.metrics.declare(self.figure_names())
        budget, described = self.link_budget(slot), self.describe(tensor, slot)
        grad = tf.reshape(tensor, [-1])
        with tf.control_dependencies([grad]):
            began = tf.timestamp()
        batch = self._open_batch(budget)
        values, tail, first = tf.zeros([0], grad.dtype), exchange.marker(), False
        if budget is not None:
            now, first = budget.now(), budget.first(graph, slot.key)
            values = self._shared_dense(slot.residual, slot.metrics.figures, grad, batch.dense,
                                        budget.config.drain)
            if first:
                tail = tf.concat([tail, tf.cast(now.figures, exchange.MARKER_DTYPE)], 0)
        with tf.control_dependencies([values]):
            left = tf.timestamp()
        position = batch.join(batch_step.Member(slot, grad, described.header, described.what, self.price(slot),
                                                began, left))
        context = self.context(batch.ticket, tensor, slot, described, None)
        return tf.concat([values, tail], 0), batch_step.Joined(batch, position, tensor, context, first,
                                                               tail.shape.num_elements())

    def _open_batch(self, budget):
        """The batch of this compressor in the open group of the current graph, opened when there is none."""
        group = exchange.open_group()
        batch = self._batches.get(group)
        if batch is None or batch.sent():
            dense = None if budget is None else budget.now().dense
            batch = self._batches[group] = batch_step.Batch(self, dense, budget)
        return batch

    @tf.function(autograph=False, reduce_retracing=True, experimental_attributes={"_noinline": True})
    def _shared_dense(self, residual, figures, grad, dense, drain):
        """A batched gradient's part of a dense step (``_dense``, its residual and metrics
        stored), else nothing; one function per dtype, shared by every gradient."""
        def step():
            view = SlotView(residual.value(), {}, {}, figures, tf.constant(0.0, tf.float64))
            values, _, _, kept = self._dense(view, grad, drain)
            with tf.control_dependencies([residual.assign(kept, read_value=False)]):
                return tf.identity(values)

        return branch.cond(dense, step, lambda: tf.zeros([0], grad.dtype))

    @tf.function(autograph=False, reduce_retracing=True, experimental_attributes={"_noinline": True})
    def _shared_step(self, view, grad, dense, began, stamps, drain, header, opens_group):
        """One gradient's step: on a dense step the gradient (``_dense``), else the sparse step;
        then its stamps. One function per dtype, whatever the size (traced twice: the second
        size makes the shapes general), shared by every gradient. Returns what precedes the
        marker in Horovod's allreduce (the gradient, or nothing), the payload to gather
        (nothing on a dense step) and the next residual."""
        def sparse():
            payload, counts, residual = self._sparse(view, grad, header, opens_group)
            return tf.zeros([0], grad.dtype), payload, counts, residual

        values, payload, counts, residual = branch.cond(dense, lambda: self._dense(view, grad, drain), sparse)
        values = Budget.left(stamps, began, values, counts, dense, elements(grad))
        return values, payload, residual

    def _dense(self, view, grad, drain):
        """A dense step: the gradient with ``drain`` of its residual flushed in (the rest
        drains on later steps, so a stale residual never hits the optimizer at once), no
        payload, its counts and the next residual."""
        n = tf.cast(elements(grad), tf.float64)
        flushed = drain * view.residual
        dense_bytes = n * grad.dtype.size
        metrics.record(view.metrics, elements=n, dense_bytes=dense_bytes, sent_elements=n, sent_bytes=dense_bytes)
        zero = tf.constant(0.0, tf.float64)
        counts = tf.stack(Counts(sent_bytes=dense_bytes, values=n, offered=n, energy=zero, least=zero))
        return grad + flushed, tf.zeros([0], tf.uint8), counts, view.residual - flushed

    @_OnDefaultInstance
    def decompress(self, tensor, ctx):
        """As ``SparseCompressor.decompress``; a dense step's sum passes through; a batched
        gradient's is its share of the batch's."""
        if isinstance(ctx, batch_step.Joined):
            return self._share(tensor, ctx)
        if not isinstance(ctx, LinkContext):
            return super().decompress(tensor, ctx)
        self._hint_if_per_tensor(tensor)
        context, n = ctx.context, ctx.context.original.shape.num_elements()
        tensor, payloads = ctx.budget.arrived(ctx.key, (tensor, context.ticket.payloads()))
        tail = 1 + FIGURES if ctx.first else 1
        marker = tensor[-tail:][:1]
        scale = exchange.marker_scale(marker)
        decode = lambda: self._shared_decode(payloads, scale, ctx.dense, tensor, self.unfolded(n),
                                             context.original.dtype, context.encoding, self.unfolded(context.mismatch))
        total = decode() if ctx.quiet is None else branch.cond(
            ctx.quiet, lambda: tf.zeros([n], context.original.dtype), decode)
        if ctx.first:
            with tf.control_dependencies([ctx.budget.brought(tensor[-FIGURES:], marker[0])]):
                total = tf.identity(total)
        return self._finish(total, context, scale)

    def _share(self, tensor, ctx):
        """``decompress`` of a batched gradient (``_join``)."""
        self._hint_if_per_tensor(tensor)
        total = ctx.batch.share(ctx.position, tensor, ctx.tail)
        marker = tensor[-ctx.tail:][:1]
        if ctx.first and ctx.batch.budget is not None:
            with tf.control_dependencies([ctx.batch.budget.brought(tensor[-FIGURES:], marker[0])]):
                total = tf.identity(total)
        return self._finish(total, ctx.context, exchange.marker_scale(marker))
