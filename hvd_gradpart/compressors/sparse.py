"""The sparse exchange every selection rule shares: sweep, select, encode, allgather.

A subclass implements ``select`` (and, when it needs them, ``state_spec``,
``transform``, ``accumulate``, ``prepare``, ``mask`` and ``after_send``); error
feedback, the exchange, the marker and the accounting are done here, once, for
all methods. A step first lets ``prepare`` derive what the rule needs from a
sample (or a compiled reduction), then one compiled pass (``_sweep``) reads
the residual and the gradient once and writes the accumulated values ``acc``
(by default ``r + g``), the method's next state and a byte mask of the
method's elementwise ``mask`` and of every non-finite element (``fused``).
When ``acc`` is finite ``select`` picks; the residual then becomes
``acc`` less what was sent, by a scatter of ``k`` values into that same
buffer, which the residual variable takes over without a copy. No sparse
update ever touches a variable (one would put it in TensorFlow's
copy-on-read mode, in which every later read and update copies it).
When ``acc`` holds NaN or Inf (a loss scale that overflowed, under mixed
precision) the step sends one NaN instead of a selection and stores
nothing: every rank's decoded sum is then not finite, as Horovod's dense
sum would be, so every rank's loss-scale optimizer skips the same step, and
the residual and the method's state stay as they were (``_not_finite``).

A subclass may ``split`` a gradient first: a key area sent another way (GradPart's spectral
key area, through the allreduce) takes its share, and the sparse step runs on the rest, or, on
a ``quiet`` step, sends nothing and keeps the rest (``_nothing``).

A gradient's whole sparse step (sweep, selection, encoding, error feedback, accounting) is one
function that takes the gradient's variables as arguments (``SlotView``), traced once per size
and dtype and called, not inlined, for every gradient of that size: the traced graph grows with
the model's distinct sizes, not with its gradients.
"""
from typing import NamedTuple

import tensorflow as tf

from hvd_gradpart import branch, exchange, formats, fused, metrics, momentum
from hvd_gradpart.budget import Counts
from hvd_gradpart.compressors.base import BaseCompressor, Context, elements


class SlotView(NamedTuple):
    """A gradient's variables and figures, as the step shared by every gradient of its size takes them."""

    residual: tf.Tensor    # its residual's value (a step returns the next one, which the caller stores)
    state: dict            # name -> its per-method variable
    inputs: dict           # name -> what ``accumulate`` gets (``SparseCompressor.inputs``)
    metrics: object        # its ``metrics.Figures``, every name declared
    price: tf.Tensor       # float64: nats a sent value costs beyond its position in its tensor (0: not priced)
    quiet: tf.Tensor = None  # bool: send nothing this step, keep it all (None: never)


class Described(NamedTuple):
    """How a sparsified gradient is named in errors and payload headers."""

    what: str      # the gradient, for errors
    header: int    # the digest every rank's payload header carries
    mismatch: str  # the error when ranks disagree on it


class SparseCompressor(BaseCompressor):
    """Error-feedback sparsification: a selection rule on the shared exchange.

    Args:
        min_elements: see ``BaseCompressor``.
        value_encoding: "native" sends values in the gradient's dtype,
            "fp16" in float16 (the rounding error stays in the residual).
        optimizer_momentum: the momentum of the SGD optimizer that applies the sums, in
            [0, 1): each sum is handed over so that the optimizer applies it once
            (``hvd_gradpart.momentum``; 0: the sums as they are); None reads it from the
            Keras optimizer that calls ``compress``, 0 when there is none.
    """

    DIAGNOSTICS = ()  # the names of ``select``'s diagnostics (declared before a shared step records them)

    def __init__(self, min_elements=1024, value_encoding="native", optimizer_momentum=0.0):
        super().__init__(min_elements=min_elements)
        exchange.wire_dtype(tf.float32, value_encoding)
        self.value_encoding = value_encoding
        self.optimizer_momentum = momentum.validate(optimizer_momentum, type(self).__name__)

    # Hooks for subclasses -------------------------------------------------

    def state_spec(self):
        """Extra per-gradient variables: ``{name: init(n, dtype) -> tensor}``."""
        return {}

    def transform(self, grad):
        """This step's flat gradient as the method sees it (default unchanged);
        may look at the whole tensor (e.g. a norm), unlike ``accumulate``."""
        return grad

    def accumulate(self, residual, grad, state):
        """What may be sent, and the next per-method state: elementwise, so
        that it compiles into the step's one pass and applies to samples too
        (``accumulated_at``).

        Args:
            residual: the residual's value.
            grad: this step's fresh flat gradient (``transform``'s result).
            state: ``{name: value}`` of the slot's per-method variables.

        Returns:
            ``(acc, next_state)``: by default error feedback ``r + g`` and no
            state; ``next_state`` maps variable names to their next values.
        """
        return residual + grad, {}

    def accumulated_at(self, residual, grad, state, pick):
        """``accumulate``'s values at the elements ``pick`` takes from a flat
        tensor (a strided slice, say): O(picked) work, nothing stored."""
        n = residual.shape.num_elements()
        at = lambda v: pick(v) if v.shape.rank == 1 and v.shape.num_elements() == n else v
        return self.accumulate(pick(residual), pick(grad), {k: at(v) for k, v in state.items()})[0]

    def prepare(self, residual, grad, state, slot):
        """What ``mask`` needs besides the tensors, from O(sample) work (see
        ``accumulated_at``) or a compiled reduction: a nest of tensors
        (default none). Writes no variable.

        Args:
            residual: the residual's value.
            grad: ``transform``'s gradient.
            state: ``{name: value}`` of the slot's per-method variables.
            slot: the gradient's ``SlotView``.
        """
        return ()

    def mask(self, acc, grad, state, plan):
        """The candidates, elementwise (compiled into one pass): a bool tensor, or None.

        Args:
            acc: ``accumulate``'s values.
            grad: this step's fresh flat gradient.
            state: ``accumulate``'s next state.
            plan: ``prepare``'s result.
        """
        return None

    def select(self, swept, grad, slot):
        """Returns ``(ascending int32 indices, diagnostics dict)`` of the elements to send.

        Args:
            swept: the step's ``fused.Swept`` (``acc``, next state, candidates, plan).
            grad: this step's fresh flat gradient.
            slot: the gradient's ``SlotView`` (for per-method state).
        """
        raise NotImplementedError

    def after_send(self, state, indices):
        """The per-method state to store once ``indices`` were sent (default ``state``)."""
        return state

    def inputs(self, slot, grad):
        """``{name: value}`` of the slot's per-method variables, as ``accumulate`` gets them
        (``grad``: the flat gradient as handed, before ``transform``)."""
        return {name: v.value() for name, v in slot.state.items()}

    def price(self, slot):
        """The link's price of a sent value for ``slot`` (nats, float64): none here."""
        return tf.constant(0.0, tf.float64)

    def split(self, slot, tensor, grad):
        """A ``spectral.Split`` of the flat ``grad`` whose sparse part this step sends, or None:
        the sparse area takes it all (the default)."""
        return None

    def after_split(self, slot, split):
        """Records what ``split``'s key area sent, once the sparse area's step recorded its own."""

    # The step ---------------------------------------------------------------

    def figure_names(self):
        """The metrics every gradient's step records (``metrics.TensorMetrics``)."""
        return metrics.COUNTERS + ("wire_format",) + self.DIAGNOSTICS

    def slot_view(self, slot, grad, split=None):
        """``SlotView`` of ``slot`` for a step on the flat ``grad``, or on ``split``'s sparse part."""
        slot.metrics.declare(self.figure_names())
        residual = slot.residual.value() if split is None else split.residual
        return SlotView(residual, dict(slot.state), self.inputs(slot, view_grad(grad, split)),
                        slot.metrics.figures, self.price(slot))

    def context(self, ticket, tensor, slot, described, split):
        """The ``Context`` of a sparsified gradient, with ``slot``'s hand-over to a momentum
        optimizer when the optimizer has one."""
        beta = momentum.calling_optimizer() if self.optimizer_momentum is None else self.optimizer_momentum
        delivered = slot.delivery() if beta > 0 else None
        return Context(ticket, tensor, described.mismatch, self.value_encoding, key_total(split), delivered, beta)

    def opens_group(self):
        """Whether the payload queued next opens its graph's group, as a shared step takes it."""
        return self.unfolded(exchange.queued() == 0)

    @tf.function(jit_compile=True)
    def _sweep(self, residual, grad, state, plan):
        """``accumulate`` and the mask bytes: one pass over the tensor, compiled from
        ``fused.XLA_MIN_ELEMENTS`` up (``fused.by_size``)."""
        acc, state = self.accumulate(residual, grad, state)
        energy = tf.reduce_sum(tf.square(tf.cast(acc, tf.float32)))
        return acc, state, fused.mask_bytes(acc, self.mask(acc, grad, state, plan)), energy

    def run_sweep(self, view, grad):
        """Accumulates, prepares and finds the candidates: the ``fused.Swept`` that ``select``
        gets once ``fused.finite`` holds. Nothing is stored.

        Args:
            view: the gradient's ``SlotView``.
            grad: its flat gradient.
        """
        grad = self.transform(grad)
        residual, state = view.residual, view.inputs
        plan = self.prepare(residual, grad, state, view)
        sweep = fused.by_size(self._sweep, grad.shape.num_elements())
        acc, state, marked, energy = sweep(residual, grad, state, plan)
        return fused.Swept(acc, state, fused.compact(marked), plan, energy)

    def _store(self, view, swept, indices, sent):
        """Error feedback: the next residual, ``acc`` less what was ``sent`` (in place: nothing
        else reads ``acc`` by then); the state is stored."""
        for name, value in self.after_send(swept.state, indices).items():
            if name in view.state:
                view.state[name].assign(value, read_value=False)
        return fused.subtract_at(swept.acc, indices, sent)

    def _compress(self, tensor):
        """Selects, updates the residual, gathers; returns ``(marker, Context)``."""
        slot = self.memory.slot(tensor, self.state_spec())
        described = self.describe(tensor, slot)
        grad = tf.reshape(tensor, [-1])
        split = self.split(slot, tensor, grad)
        view = self.slot_view(slot, grad, split)
        payload, _, residual = self._shared_sparse(view, view_grad(grad, split), described.header, self.opens_group())
        slot.residual.assign(residual, read_value=False)
        self.after_split(slot, split)
        ticket = exchange.enqueue(payload, described.header, described.what)
        return exchange.marker(), self.context(ticket, tensor, slot, described, split)

    def describe(self, tensor, slot):
        """``Described`` of a sparsified gradient in ``slot``."""
        what = f"gradient {slot.key} ({tensor.dtype.name}{tensor.shape})"
        setting = f"{type(self).__name__}{self.settings()}"
        header = exchange.digest(f"{tensor.shape.num_elements()}/{tensor.dtype.name}/{setting}")
        return Described(what, header, f"hvd_gradpart: ranks disagree on {what} under {setting}: every rank "
                                       "must build the same model and the same compressor settings")

    def _sparse(self, view, grad, header, opens_group):
        """Selects and records. Returns the payload to gather, the float64 ``budget.Counts``
        and the next residual;
        of accumulated values that hold NaN or Inf, ``_not_finite``'s.

        Args:
            view: the gradient's ``SlotView``.
            grad: its flat gradient (its length may be known only as the graph runs).
            header: the digest its payload's header carries (an int or int32 tensor).
            opens_group: bool tensor, its payload opens the group (and carries the group's tag).
        """
        if view.quiet is not None:
            return branch.cond(view.quiet, lambda: self._nothing(view, grad, header, opens_group),
                               lambda: self._sparse(view._replace(quiet=None), grad, header, opens_group))
        swept = self.run_sweep(view, grad)
        return branch.cond(fused.finite(swept.acc, swept.candidates),
                           lambda: self._send(view, grad, swept, header, opens_group),
                           lambda: self._not_finite(view, grad, swept.energy, header, opens_group))

    def _send(self, view, grad, swept, header, opens_group):
        """``_sparse`` of finite accumulated values: selects, encodes, stores and records."""
        n = elements(grad)
        indices, diagnostics = self.select(swept, grad, view)
        values = tf.gather(swept.acc, indices)
        encoded = exchange.encode(values, indices, n, self.value_encoding, header, ascending=True)
        residual = self._store(view, swept, indices, encoded.sent)
        sent = exchange.sent_bytes(encoded.payload, opens_group)
        metrics.record(view.metrics, elements=n, dense_bytes=n * grad.dtype.size, sent_elements=tf.size(indices),
                       sent_bytes=sent, wire_format=encoded.format, **diagnostics)
        least = tf.reduce_min(tf.square(tf.cast(values, tf.float64)))  # +inf when nothing was sent (then unused)
        as64 = lambda x: tf.cast(x, tf.float64)
        counts = tf.stack(Counts(as64(sent), as64(tf.size(indices)), as64(swept.candidates.count), as64(swept.energy),
                                 least))
        return encoded.payload, counts, residual

    def _nothing(self, view, grad, header, opens_group):
        """``_sparse``'s results when a step sends nothing: a payload of no values, the counts,
        and the residual ``r + g``."""
        kept = view.residual + grad
        energy = tf.reduce_sum(tf.square(tf.cast(kept, tf.float64)))
        payload, counts = self._unselected(view, grad, tf.zeros([0], grad.dtype), energy, header, opens_group)
        return payload, counts, kept

    def _not_finite(self, view, grad, energy, header, opens_group):
        """``_sparse``'s results when the accumulated values hold NaN or Inf: a payload of one NaN
        (every rank's decoded sum is then not finite), the counts (the accumulated energy, not
        finite, marks a step that did not train: ``budget.clock``) and the residual as it was."""
        nan = tf.fill([1], tf.constant(float("nan"), grad.dtype))
        payload, counts = self._unselected(view, grad, nan, tf.cast(energy, tf.float64), header, opens_group)
        return payload, counts, view.residual

    def _unselected(self, view, grad, values, energy, header, opens_group):
        """The payload of ``values`` at the first positions, sent in place of a selection, and
        ``_sparse``'s counts of it (no value counted as sent); records the bytes."""
        n = elements(grad)
        encoded = exchange.encode(values, tf.range(tf.size(values)), n, self.value_encoding, header, ascending=True,
                                  form=formats.WORD_GAPS)
        sent = exchange.sent_bytes(encoded.payload, opens_group)
        metrics.record(view.metrics, elements=n, dense_bytes=n * grad.dtype.size, sent_elements=0, sent_bytes=sent,
                       wire_format=encoded.format)
        zero = tf.constant(0.0, tf.float64)
        counts = tf.stack(Counts(tf.cast(sent, tf.float64), zero, zero, energy, tf.constant(float("inf"), tf.float64)))
        return encoded.payload, counts

    @tf.function(autograph=False, experimental_attributes={"_noinline": True})
    def _shared_sparse(self, view, grad, header, opens_group):
        """``_sparse`` as one function per size and dtype, shared by every gradient of them."""
        return self._sparse(view, grad, header, opens_group)


def view_grad(grad, split):
    """The flat gradient the sparse area's step takes: ``grad``, or ``split``'s sparse part."""
    return grad if split is None else split.grad


def key_total(split):
    """The key area's sum over ranks that ``decompress`` adds (``Context.key``), or None."""
    return None if split is None else split.total
