"""Base class of every sparse method: a selection rule on the shared exchange.

A subclass implements ``select`` (and, when it needs them, ``state_spec``,
``accumulate`` and ``after_send``); error feedback, the exchange, the
marker and the accounting are done here, once, for all methods.
"""
import logging
import weakref

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from hvd_gradpart import exchange
from hvd_gradpart.memory import Memory, SharedWhileTracing, function_graph

_LOG = logging.getLogger("hvd_gradpart")
PER_TENSOR_HINT = (
    "hvd_gradpart: Horovod hands %s one gradient at a time, so every gradient takes its own "
    "allgather; pass groups=1 (num_groups=1 in older scripts) to hvd.DistributedGradientTape or "
    "hvd.DistributedOptimizer and all of a step's gradients travel in one collective")

SPARSE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class _OnDefaultInstance:
    """Method descriptor: ``Cls.method(...)`` runs on ``Cls.instance()``.

    Horovod calls ``compression.compress(t)`` on whatever it was given, so a
    class (``compression=TopKCompressor``) must behave like an instance with
    default settings.
    """

    def __init__(self, fn):
        self.fn = tf.autograph.experimental.do_not_convert(fn)
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        return self.fn.__get__(cls.instance() if obj is None else obj, cls)


class SparseCompressor(Compressor, tf.Module, metaclass=SharedWhileTracing):
    """Error-feedback sparsification behind Horovod's ``Compressor`` API.

    Args:
        min_elements: tensors with fewer elements are sent whole, untouched
            (sparsifying them saves nothing): through Horovod's dense allreduce,
            or, for float dtypes other than float32, in the exchange's allgather.
        value_encoding: "native" sends values in the gradient's dtype,
            "fp16" in float16 (the rounding error stays in the residual).
    """

    _defaults = {}
    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_alone"}

    def __init__(self, min_elements=1024, value_encoding="native"):
        tf.Module.__init__(self, name=type(self).__name__)
        if not isinstance(min_elements, int) or min_elements < 0:
            raise ValueError(f"min_elements must be an int >= 0, got {min_elements!r}")
        exchange.wire_dtype(tf.float32, value_encoding)
        self.min_elements = min_elements
        self.value_encoding = value_encoding
        self.memory = Memory()
        self._alone = weakref.WeakKeyDictionary()
        self._hinted = False

    @classmethod
    def instance(cls):
        """The default-configured instance used when the class itself is passed."""
        if cls not in SparseCompressor._defaults:
            SparseCompressor._defaults[cls] = cls()
        return SparseCompressor._defaults[cls]

    # Hooks for subclasses -------------------------------------------------

    def state_spec(self):
        """Extra per-gradient variables: ``{name: init(n, dtype) -> tensor}``."""
        return {}

    def accumulate(self, slot, grad):
        """Adds this step's contribution to the residual in place; returns
        what may be sent (default error feedback ``r + g``)."""
        slot.residual.assign_add(grad, read_value=False)
        return slot.residual.read_value()

    def select(self, acc, grad, slot):
        """Returns ``(int32 indices, diagnostics dict)`` of elements to send.

        Args:
            acc: accumulated flat values (``accumulate``'s result).
            grad: this step's fresh flat gradient.
            slot: the gradient's ``Slot`` (for per-method state).
        """
        raise NotImplementedError

    def after_send(self, slot, indices):
        """Updates per-method state once ``indices`` were sent."""

    # Horovod's Compressor API ---------------------------------------------

    def sparsifies(self, tensor):
        """Whether ``tensor`` goes through the sparse exchange."""
        n = tensor.shape.num_elements()
        return tensor.dtype in SPARSE_DTYPES and n is not None and n >= max(self.min_elements, 1)

    def settings(self):
        """The scalar settings every rank must share (hashed into each payload header)."""
        return {k: v for k, v in sorted(vars(self).items())
                if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple))}

    @_OnDefaultInstance
    def compress(self, tensor):
        """Selects, updates the residual, gathers; returns ``(marker, ctx)``."""
        if not self.sparsifies(tensor):
            return self._whole(tensor) if _travels_whole(tensor) else (tensor, None)
        slot = self.memory.slot(tensor, self.state_spec())
        n = tensor.shape.num_elements()
        what = f"gradient {slot.key} ({tensor.dtype.name}{tensor.shape})"
        grad = tf.reshape(tensor, [-1])
        finite = tf.debugging.Assert(_all_finite(grad), [
            f"hvd_gradpart: {what} holds NaN or Inf; its residual was left unchanged. "
            "Lower the learning rate or clip gradients"])
        with tf.control_dependencies([finite]):
            acc = self.accumulate(slot, grad)
        indices, diagnostics = self.select(acc, grad, slot)
        setting = f"{type(self).__name__}{self.settings()}"
        header = exchange.digest(f"{n}/{tensor.dtype.name}/{setting}")
        encoded = exchange.encode(tf.gather(acc, indices), indices, self.value_encoding, header)
        with tf.control_dependencies([encoded.payload]):
            slot.residual.scatter_nd_sub(indices[:, None], encoded.sent)
        self.after_send(slot, indices)
        ticket = exchange.enqueue(encoded, header, what)
        k = tf.size(indices)
        slot.metrics.record(
            elements=n, dense_bytes=n * tensor.dtype.size, sent_elements=k,
            sent_bytes=exchange.payload_bytes(k, tensor.dtype, self.value_encoding, ticket.position == 0),
            **diagnostics)
        mismatch = (f"hvd_gradpart: ranks disagree on {what} under {setting}: every rank must build "
                    "the same model and the same compressor settings")
        return exchange.marker(), (ticket, tensor, mismatch, self.value_encoding)

    def _whole(self, tensor):
        """Queues every element of a small float tensor whose dtype is not the marker's."""
        n = tensor.shape.num_elements()
        what = f"small gradient ({tensor.dtype.name}{tensor.shape})"
        header = exchange.digest(f"whole/{n}/{tensor.dtype.name}")
        encoded = exchange.encode(tf.reshape(tensor, [-1]), tf.range(n), "native", header)
        mismatch = (f"hvd_gradpart: ranks disagree on {what}: every rank must build the same model "
                    "and the same compressor settings")
        return exchange.marker(), (exchange.enqueue(encoded, header, what), tensor, mismatch, "native")

    def _hint_if_per_tensor(self, reduced):
        """Logs ``PER_TENSOR_HINT`` once (rank 0) when a second gradient of one
        traced function comes through Horovod's per-tensor path (its marker
        was reduced by a lone ``HorovodAllreduce``, not a grouped one)."""
        graph = function_graph()
        if self._hinted or graph is None or getattr(reduced.op, "type", None) != "HorovodAllreduce":
            return
        self._alone[graph] = self._alone.get(graph, 0) + 1
        if self._alone[graph] >= 2:
            self._hinted = True
            if hvd.rank() == 0:
                _LOG.warning(PER_TENSOR_HINT, type(self).__name__)

    @_OnDefaultInstance
    def decompress(self, tensor, ctx):
        """Decodes the gathered selections, scaled by the reduced marker; dense passes through."""
        if ctx is None:
            return tensor
        ticket, original, mismatch, encoding = ctx
        self._hint_if_per_tensor(tensor)
        total = exchange.decode_sum(ticket.rows(), original.shape.num_elements(), original.dtype,
                                    encoding, exchange.marker_scale(tensor), mismatch)
        return tf.reshape(total, original.shape)


def _travels_whole(tensor):
    """Whether a tensor too small to sparsify still goes through the exchange, whole.

    Horovod's grouped allreduce takes one dtype per group and every marker is
    ``exchange.MARKER_DTYPE``, so a small float tensor of another dtype rides
    in the group's allgather instead (any dtype mix then groups); small
    float32 and non-float tensors go through Horovod's allreduce untouched.
    """
    return (tensor.dtype in SPARSE_DTYPES and tensor.dtype != exchange.MARKER_DTYPE
            and tensor.shape.num_elements() is not None)


@tf.function(jit_compile=True)
def _all_finite(x):
    """Whether every element of ``x`` is finite (one fused pass)."""
    return tf.reduce_all(tf.math.is_finite(x))
