"""The root of every compressor here: settings, residual memory, and what travels uncompressed.

A compressor is a ``tf.Module`` behind Horovod's ``Compressor`` API. This layer holds what every
method shares and nothing of how one compresses: its settings (checked on construction; a
research config's fields, passed flat by the registry, included; hashed into payload headers by
``settings``), its residual memory (``hvd_gradpart.memory``: one slot per gradient), the class
standing in for a default instance (``compression=TopKCompressor``), and the tensors a method
leaves alone: below ``min_elements``, or not float, a tensor goes to Horovod's allreduce
untouched, or, when its float dtype is not the marker's, whole through the exchange's allgather
(a group takes one dtype). ``compress`` hands a tensor it compresses to the subclass's
``_compress``; ``decompress`` decodes what the exchange gathered, one function per dtype and
encoding shared by every gradient.
"""
import dataclasses
import functools
import inspect
import logging
import types
import weakref

from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from hvd_gradpart import branch, exchange, momentum
from hvd_gradpart.memory import Memory, SharedWhileTracing, creating_slot_variables, function_graph

_LOG = logging.getLogger("hvd_gradpart")
PER_TENSOR_HINT = (
    "hvd_gradpart: Horovod hands %s one gradient at a time, so every gradient takes its own "
    "allgather; pass groups=1 (num_groups=1 in older scripts) to hvd.DistributedGradientTape or "
    "hvd.DistributedOptimizer and all of a step's gradients travel in one collective")

SPARSE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class Context(NamedTuple):
    """What ``compress`` hands ``decompress`` for a gradient that went through the exchange."""

    ticket: exchange.Ticket  # where its payload's gathered copies come from
    original: tf.Tensor      # the gradient as Horovod handed it (shape, dtype)
    mismatch: str            # the error when ranks disagree on it
    encoding: str            # how its values travel
    key: tf.Tensor = None    # a spectral key area's sum over ranks, flat (``hvd_gradpart.spectral``), if any
    delivered: tf.Variable = None  # the last sum handed to a momentum optimizer (``hvd_gradpart.momentum``), if any
    momentum: float = 0.0    # that optimizer's momentum


class _OnDefaultInstance:
    """Method descriptor: ``Cls.method(...)`` runs on ``Cls.instance()``, and
    the variables it makes are slot variables (``creating_slot_variables``).

    Horovod calls ``compression.compress(t)`` on whatever it was given, so a
    class (``compression=TopKCompressor``) must behave like an instance with
    default settings; and it may call it while retracing a function on a
    later call (its cached allreduce, for a second model), where
    ``tf.function`` would refuse the new slots' variables.
    """

    def __init__(self, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with creating_slot_variables():
                return fn(*args, **kwargs)

        self.fn = tf.autograph.experimental.do_not_convert(run)
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls):
        return self.fn.__get__(cls.instance() if obj is None else obj, cls)


class _InitSignature:
    """``Cls.__signature__``: its ``__init__``'s arguments, which ``inspect`` and ``help`` would
    otherwise read off the metaclass's ``__call__(*args, **kwargs)``."""

    def __get__(self, obj, cls):
        init = inspect.signature(cls.__init__)
        return init.replace(parameters=list(init.parameters.values())[1:])


class BaseCompressor(Compressor, tf.Module, metaclass=SharedWhileTracing):
    """Settings, residual memory and uncompressed passage shared by every method.

    Args:
        min_elements: tensors with fewer elements are sent whole, untouched
            (compressing them saves nothing): through Horovod's dense allreduce,
            or, for float dtypes other than float32, in the exchange's allgather.
    """

    __signature__ = _InitSignature()
    RESEARCH = None  # the type of the method's research config (its ``research`` argument), if any
    SHARED_STATE = ()  # the per-gradient state every rank derives alike (restarted at an elastic reset)
    _defaults = {}
    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_alone", "_unfolded"}

    def __init__(self, min_elements=1024):
        tf.Module.__init__(self, name=type(self).__name__)
        if not isinstance(min_elements, int) or min_elements < 0:
            raise ValueError(f"min_elements must be an int >= 0, got {min_elements!r}")
        self.min_elements = min_elements
        self.memory = Memory(type(self).__name__)
        self._alone = weakref.WeakKeyDictionary()
        self._unfolded = types.SimpleNamespace(variables={})  # untracked: no checkpoint holds them
        self._hinted = False

    @classmethod
    def from_options(cls, **options):
        """An instance from flat options (the registry's and the method grammar's ``KEY=VALUE``):
        an option named like a field of ``RESEARCH`` sets that field of ``research``."""
        fields = {f.name for f in dataclasses.fields(cls.RESEARCH)} if cls.RESEARCH else set()
        research = {name: options.pop(name) for name in sorted(fields & set(options))}
        if research:
            options["research"] = dataclasses.replace(options.get("research", cls.RESEARCH()), **research)
        return cls(**options)

    def sums_in_compress(self):
        """Whether ``compress`` itself sums over ranks (collectives of its own beside the
        exchange), so that only real ranks can run it."""
        return False

    @classmethod
    def instance(cls):
        """The default-configured instance used when the class itself is passed."""
        if cls not in BaseCompressor._defaults:
            BaseCompressor._defaults[cls] = cls()
        return BaseCompressor._defaults[cls]

    def settings(self):
        """The scalar settings every rank must share (hashed into each payload header)."""
        scalars = (bool, int, float, str, tuple)
        found = {k: v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, scalars)}
        if dataclasses.is_dataclass(getattr(self, "research", None)):
            found.update(dataclasses.asdict(self.research))
        return dict(sorted(found.items()))

    def sparsifies(self, tensor):
        """Whether ``tensor`` is compressed (float, of known size, at least ``min_elements``)."""
        n = tensor.shape.num_elements()
        return tensor.dtype in SPARSE_DTYPES and n is not None and n >= max(self.min_elements, 1)

    def unfolded(self, value):
        """``value`` (a string, bool or int) as a tensor read from a variable of its own (made once,
        untracked): a shared step takes its per-gradient arguments so, because the graph
        optimizer copies a function for every call that passes it a constant."""
        key = (type(value), value)
        made = self._unfolded.variables
        if key not in made:
            with tf.init_scope():
                made[key] = tf.Variable(value, trainable=False, name="unfolded")
        return made[key].read_value()

    # Horovod's Compressor API ---------------------------------------------

    @_OnDefaultInstance
    def compress(self, tensor):
        """``(marker or tensor, ctx)``: ``_compress`` of a tensor this method compresses
        (``sparsifies``); any other passes uncompressed (module doc)."""
        if self.sparsifies(tensor):
            return self._compress(tensor)
        return self._whole(tensor) if _travels_whole(tensor) else (tensor, None)

    def _compress(self, tensor):
        """The method's ``(marker or tensor, ctx)`` of a tensor it compresses."""
        raise NotImplementedError

    def _whole(self, tensor):
        """Queues every element of a small float tensor whose dtype is not the marker's."""
        n = tensor.shape.num_elements()
        what = f"small gradient ({tensor.dtype.name}{tensor.shape})"
        header = exchange.digest(f"whole/{n}/{tensor.dtype.name}")
        encoded = exchange.encode(tf.reshape(tensor, [-1]), tf.range(n), n, "native", header, ascending=True)
        mismatch = (f"hvd_gradpart: ranks disagree on {what}: every rank must build the same model "
                    "and the same compressor settings")
        return exchange.marker(), Context(exchange.enqueue(encoded.payload, header, what), tensor, mismatch,
                                          "native")

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
        """Decodes the gathered payloads, scaled by the reduced marker; dense passes through."""
        if ctx is None:
            return tensor
        self._hint_if_per_tensor(tensor)
        scale = exchange.marker_scale(tensor)
        total = self._shared_decode(ctx.ticket.payloads(), scale, self.unfolded(False),
                                    tf.zeros([0], ctx.original.dtype), self.unfolded(ctx.original.shape.num_elements()),
                                    ctx.original.dtype, ctx.encoding, self.unfolded(ctx.mismatch))
        return self._finish(total, ctx, scale)

    @tf.function(autograph=False, reduce_retracing=True, experimental_attributes={"_noinline": True})
    def _shared_decode(self, payloads, scale, dense, reduced, n, dtype, encoding, mismatch):
        """Every rank's payload decoded into the dense sum of ``n`` (an int32 tensor) values,
        times ``scale`` (``dense``: the first ``n`` values of ``reduced``, Horovod's own sum,
        instead); one function per dtype and encoding, whatever the size (traced twice: the
        second size makes the shapes general), shared by every gradient."""
        return branch.cond(dense, lambda: reduced[:n], lambda: exchange.decode_sum(
            payloads, n, dtype, encoding, scale, mismatch))

    @staticmethod
    def _finish(total, ctx, scale):
        """The flat decoded sum, plus its key area's sum times ``scale`` when it has one, handed
        over to a momentum optimizer (``momentum.hand_over``) when the context says so, in the
        gradient's shape."""
        if ctx.key is not None:
            total = total + ctx.key * tf.cast(scale, ctx.key.dtype)
        if ctx.delivered is not None:
            total = momentum.hand_over(total, ctx.delivered, ctx.momentum)
        return tf.reshape(total, ctx.original.shape)


def elements(tensor):
    """The number of elements of ``tensor``: an int where its shape says, else an int32 tensor."""
    n = tensor.shape.num_elements()
    return tf.size(tensor) if n is None else n


def _travels_whole(tensor):
    """Whether a tensor too small to sparsify still goes through the exchange, whole.

    Horovod's grouped allreduce takes one dtype per group and every marker is
    ``exchange.MARKER_DTYPE``, so a small float tensor of another dtype rides
    in the group's allgather instead (any dtype mix then groups); small
    float32 and non-float tensors go through Horovod's allreduce untouched.
    """
    return (tensor.dtype in SPARSE_DTYPES and tensor.dtype != exchange.MARKER_DTYPE
            and tensor.shape.num_elements() is not None)
