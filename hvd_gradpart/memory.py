"""Residual memory (error feedback), one slot per gradient.

Horovod hands ``compress`` a bare tensor, no name. A gradient is identified
by where its ``compress`` call happens: the k-th call while tracing function
``f`` is slot ``"f/k"``. Every trace of ``f`` (first call, retrace, the
``tf.function`` Horovod wraps around eager ``DistributedGradientTape``) asks
for the gradients in the same order, so each one finds the same slot.
``tf.cond``/``while`` branch graphs count toward the function that holds
them. Outside any function (direct eager ``hvd.allreduce``) a slot is keyed
by dtype and shape, so same-shaped eager tensors share one residual.

Slot variables are created once, outside the graph (``tf.init_scope``), and
are tracked, so ``tf.train.Checkpoint(compressor=...)`` saves and restores
them, also when the restore comes before the first step.

A compressor may also be built inside the traced function (as Horovod's
synthetic benchmark builds its compression). Each trace then calls the
constructor again, and a fresh instance would need fresh variables, which
``tf.function`` forbids after its first trace. ``SharedWhileTracing`` makes
the k-th construction with the same class and arguments in any trace of one
``tf.function`` return the instance the first trace built, so every trace
finds the same slots.
"""
import re
import sys
import weakref

from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

import tensorflow as tf

from hvd_gradpart.metrics import TensorMetrics
from hvd_gradpart.pacing import Pacer

_BRANCH_GRAPHS = ("CondBranchFuncGraph", "WhileCondFuncGraph", "WhileBodyFuncGraph")


def function_graph():
    """The graph of the enclosing traced function, or None when eager."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    while type(graph).__name__ in _BRANCH_GRAPHS:
        graph = graph.outer_graph
    return graph


def tracing_function():
    """The innermost ``tf.function`` now being traced, or None."""
    if tf.executing_eagerly():
        return None
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Function):
            return owner
        frame = frame.f_back
    return None


class SharedWhileTracing(type):
    """Metaclass: constructions inside a traced ``tf.function`` are shared
    across its traces (see the module doc)."""

    _shared = weakref.WeakKeyDictionary()  # Function -> {(class, arguments): [instances]}
    _made = weakref.WeakKeyDictionary()  # trace graph -> {(class, arguments): constructions so far}

    def __call__(cls, *args, **kwargs):
        owner = tracing_function()
        if owner is None:
            return super().__call__(*args, **kwargs)
        key = (cls, repr(args), repr(sorted(kwargs.items())))
        made = SharedWhileTracing._made.setdefault(function_graph(), {})
        k = made.get(key, 0)
        instances = SharedWhileTracing._shared.setdefault(owner, {}).setdefault(key, [])
        if len(instances) <= k:
            instances.append(super().__call__(*args, **kwargs))
        made[key] = k + 1
        return instances[k]


def _clean(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Slot(tf.Module):
    """State of one gradient: its residual, any per-method variables and,
    when the compressor paces, its ``Pacer`` (else None)."""

    def __init__(self, key, shape, dtype, state_spec, paced=False):
        super().__init__(name=None)
        self.key = key
        self.shape = tf.TensorShape(shape)
        n = self.shape.num_elements()
        self.residual = tf.Variable(tf.zeros([n], dtype), trainable=False, name="residual")
        self.state = {name: tf.Variable(init(n, dtype), trainable=False, name=name)
                      for name, init in state_spec.items()}
        self.pacer = Pacer(n, dtype) if paced else None
        self.metrics = TensorMetrics()


class Memory(tf.Module):
    """All slots of one compressor, keyed as described in the module doc."""

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_calls"}

    def __init__(self):
        super().__init__(name="memory")
        self.slots = {}
        self._calls = weakref.WeakKeyDictionary()

    def slot_key(self, tensor):
        """The key of the gradient now being compressed (counts the call)."""
        graph = function_graph()
        if graph is None:
            dims = "x".join(str(d) for d in tensor.shape.as_list()) or "scalar"
            return f"eager/{tensor.dtype.name}/{dims}"
        k = self._calls.get(graph, 0)
        self._calls[graph] = k + 1
        return f"{_clean(graph.name)}/{k}"

    def slot(self, tensor, state_spec=None, paced=False):
        """The slot for ``tensor``, created on first use (with a ``Pacer`` when ``paced``).

        Raises:
            ValueError: a retrace handed this call position a gradient of a
                different shape or dtype (the model changed between traces).
        """
        key = self.slot_key(tensor)
        found = self.slots.get(key)
        if found is None:
            with tf.init_scope():
                found = Slot(key, tensor.shape, tensor.dtype, state_spec or {}, paced)
                self.slots[key] = found
        elif found.shape != tensor.shape or found.residual.dtype != tensor.dtype:
            raise ValueError(
                f"gradient slot {key!r} holds a residual of {found.residual.dtype.name}"
                f"{found.shape}, but this trace passes {tensor.dtype.name}{tensor.shape}; "
                "use a new compressor instance for a different model")
        return found

    def residual_mass(self):
        """Sum of every residual, as a float64 scalar (for conservation checks)."""
        return tf.add_n([tf.reduce_sum(tf.cast(s.residual, tf.float64)) for s in self.slots.values()]
                        or [tf.constant(0.0, tf.float64)])
