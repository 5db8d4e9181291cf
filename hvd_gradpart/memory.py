"""Residual memory (error feedback), one slot per gradient.

Horovod hands ``compress`` a bare tensor, no name. A gradient is identified
by where its ``compress`` call happens: the k-th call while tracing function
``f`` is slot ``"f/k"``. Every trace of ``f`` (first call, retrace, the
``tf.function`` Horovod wraps around eager ``DistributedGradientTape``) asks
for the gradients in the same order, so each one finds the same slot.
``tf.cond``/``while`` branch graphs count toward the function that holds
them. The name ``f`` belongs to the step that first traced it: the
outermost ``tf.function`` being traced (a user's step, or Keras's
``train_function`` around the allreduce function Horovod caches per
compressor and settings) and, for a function traced inside it, that
function's input signature (a GAN's two optimizers in one step). Another
step or signature tracing ``f`` (another model's step made from the same
Python function, another Keras model) gets ``"f#2/k"``, the next one
``"f#3/k"``, in order of first use, so a script makes the same keys in every
run and checkpoints find them. Horovod hands a later model whose gradients
have the same shapes its cached trace, untraced, and nothing can give that
model slots of its own: such a trace checks at each call that its step, or
a step its Keras model runs after a recompile, is running it, and fails at
once otherwise. An eager loop runs every model through one trace of
Horovod's: a model of other shapes fails at once (the retrace meets slots of
other shapes), one of the same shapes cannot be told apart. Outside any
function (direct eager ``hvd.allreduce``) a slot is keyed by dtype and
shape, so same-shaped eager tensors share one residual.

Slot variables are created once, eagerly (``tf.init_scope``), past the
variable creator of any ``tf.function`` being traced
(``creating_slot_variables``): they are singletons the memory holds, and
Horovod may retrace its cached allreduce for a new model on a later call,
when ``tf.function`` refuses new variables. They are tracked, so
``tf.train.Checkpoint(compressor=...)`` saves and restores them, also when
the restore comes before the first step.

A compressor may also be built inside the traced function (as Horovod's
synthetic benchmark builds its compression). Each trace then calls the
constructor again, and a fresh instance would start every retrace from empty
slots. ``SharedWhileTracing`` makes the k-th construction with the same
class and arguments in any trace of one ``tf.function`` return the instance
the first trace built, so every trace finds the same slots.
"""
import collections
import re
import sys
import weakref

from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops.resource_variable_ops import default_variable_creator_v2

import tensorflow as tf

from hvd_gradpart.metrics import TensorMetrics

_BRANCH_GRAPHS = ("CondBranchFuncGraph", "WhileCondFuncGraph", "WhileBodyFuncGraph")


def function_graph():
    """The graph of the enclosing traced function, or None when eager."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    while type(graph).__name__ in _BRANCH_GRAPHS:
        graph = graph.outer_graph
    return graph


def called_at_call_time():
    """Whether a value captured at call time by the enclosing traced function reaches it: TensorFlow
    carries such a value from a function to the function that calls it (Horovod's allreduce
    function inside Keras's train function), but not into a ``tf.cond`` or loop branch that
    calls it (Horovod's gradient aggregation, ``backward_passes_per_step`` > 1)."""
    graph = function_graph()
    while graph is not None:
        outer = getattr(graph, "outer_graph", None)
        if type(outer).__name__ in _BRANCH_GRAPHS:
            return False
        graph = outer if isinstance(outer, FuncGraph) else None
    return True


def frames():
    """The frames on the Python stack, innermost (the caller's) first."""
    frame = sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


def callers():
    """The ``self`` of every method running on the Python stack, innermost first."""
    return (frame.f_locals["self"] for frame in frames() if frame.f_locals.get("self") is not None)


def tracing_function():
    """The innermost ``tf.function`` now being traced, or None."""
    if tf.executing_eagerly():
        return None
    return next((owner for owner in callers() if isinstance(owner, Function)), None)


def running_step():
    """``(step, runner)``: the outermost ``tf.function`` on the Python stack
    (being traced or, eagerly, called) and the object whose method called it
    (a Keras model in ``fit``); None for either that is not there."""
    step = runner = None
    for owner in callers():
        if isinstance(owner, Function):
            step, runner = owner, None
        elif step is not None and runner is None:
            runner = owner
    return step, runner


def _past_function_scopes(next_creator, **kwargs):
    del next_creator  # the tf.function's creator, which refuses variables after its first call
    return default_variable_creator_v2(None, **kwargs)


def creating_slot_variables():
    """Scope for the variables of a slot: singletons the memory holds, made on
    any trace (see the module doc)."""
    return tf.variable_creator_scope(_past_function_scopes)


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


def _weak(obj):
    """A weak reference to ``obj``; one that always answers None when ``obj`` is None or takes none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: None


def _clean(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Slot(tf.Module):
    """State of one gradient: its residual and any per-method variables."""

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_state_spec"}

    def __init__(self, key, shape, dtype, state_spec):
        super().__init__(name=None)
        self.key = key
        self.shape = tf.TensorShape(shape)
        self._state_spec = dict(state_spec)
        n = self.shape.num_elements()
        self.residual = tf.Variable(tf.zeros([n], dtype), trainable=False, name="residual")
        self.state = {name: tf.Variable(init(n, dtype), trainable=False, name=name)
                      for name, init in state_spec.items()}
        self.metrics = TensorMetrics()
        self.delivered = None  # the last sum handed to a momentum optimizer (``hvd_gradpart.momentum``)

    def delivery(self):
        """``delivered``, made (zeros) on first use."""
        if self.delivered is None:
            with tf.init_scope(), creating_slot_variables():
                self.delivered = tf.Variable(tf.zeros_like(self.residual), trainable=False, name="delivered")
        return self.delivered

    def rank_local(self):
        """The variables that differ from rank to rank: the residual, then the per-method
        state (both come from this rank's own gradients)."""
        return [self.residual, *self.state.values()]

    def committed(self):
        """What an elastic commit keeps of the slot: ``rank_local``, and ``delivered`` (equal on
        every rank, kept with the commit as the optimizer's velocity is)."""
        return self.rank_local() + ([self.delivered] if self.delivered is not None else [])

    def reset(self):
        """Puts the committed variables back to their values at creation."""
        n, dtype = self.residual.shape.num_elements(), self.residual.dtype
        self.residual.assign(tf.zeros_like(self.residual))
        for name, init in self._state_spec.items():
            self.state[name].assign(init(n, dtype))
        self.forget_delivered()

    def restart(self, names):
        """Puts the per-method variables ``names`` back to their values at creation."""
        n, dtype = self.residual.shape.num_elements(), self.residual.dtype
        for name in names:
            self.state[name].assign(self._state_spec[name](n, dtype))

    def forget_delivered(self):
        """Zeros ``delivered`` (its value at creation), where it exists."""
        if self.delivered is not None:
            self.delivered.assign(tf.zeros_like(self.delivered))


class Memory(tf.Module):
    """All slots of one compressor, keyed as described in the module doc.

    Args:
        label: the compressor's class name, for the errors' advice (e.g. ``"TopKCompressor"``).
    """

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_calls", "_claims", "_guarded"}

    def __init__(self, label=None):
        super().__init__(name="memory")
        self.label = label
        self.slots = {}
        self._calls = weakref.WeakKeyDictionary()  # trace graph -> compress calls so far
        # graph name -> [(weak reference to a step, signature)] that traced it, in order (a
        # defaultdict, which tf.Module leaves untracked: no checkpoint dependency)
        self._claims = collections.defaultdict(list)
        self._guarded = weakref.WeakSet()  # trace graphs that check their step at each call

    def _advice(self):
        example = f" (compression={self.label}(), not the class)" if self.label else ""
        return f"use a new compressor instance for each model{example}"

    def _named(self, graph, step, signature):
        """``graph``'s cleaned name, suffixed ``#n`` when ``(step, signature)``
        is the n-th to trace it."""
        name = _clean(graph.name)
        if step is None:
            return name
        claims = self._claims[name]
        n = next((i for i, (ref, sig) in enumerate(claims) if ref() is step and sig == signature), None)
        if n is None:
            claims.append((weakref.ref(step), signature))
            n = len(claims) - 1
        return name if n == 0 else f"{name}#{n + 1}"

    def _guard(self, graph, name, step, runner):
        """Makes every call of ``graph``'s function fail unless ``step``, or
        another step that ``runner`` runs (its model recompiled), calls it."""
        self._guarded.add(graph)
        step_ref, runner_ref, advice = weakref.ref(step), _weak(runner), self._advice()
        with tf.init_scope():
            passed = tf.constant(True)

        def check():
            caller, by = running_step()
            if caller is not None and caller is not step_ref() and (by is None or by is not runner_ref()):
                raise ValueError(
                    f"hvd_gradpart: {caller.__name__} runs gradient slots {name}/*, which hold "
                    "the residuals of another model's step: Horovod reuses its traced allreduce "
                    "for every model whose gradients have the same shapes when they share a "
                    f"compressor, so their residuals would mix; {advice}")
            return passed

        graph.capture_call_time_value(check, tf.TensorSpec([], tf.bool), default_value=passed)  # saving: no call

    def slot_key(self, tensor):
        """The key of the gradient now being compressed (counts the call)."""
        graph = function_graph()
        if graph is None:
            dims = "x".join(str(d) for d in tensor.shape.as_list()) or "scalar"
            return f"eager/{tensor.dtype.name}/{dims}"
        k = self._calls.get(graph, 0)
        self._calls[graph] = k + 1
        step, runner = running_step()
        nested = step is not None and step is not tracing_function()
        name = self._named(graph, step, repr(graph.structured_input_signature) if nested else None)
        if nested and graph not in self._guarded:
            self._guard(graph, name, step, runner)
        return f"{name}/{k}"

    def slot(self, tensor, state_spec=None):
        """The slot for ``tensor``, created on first use.

        Raises:
            ValueError: a retrace handed this call position a gradient of a
                different shape or dtype (one traced function ran a
                different model, as Horovod's cached trace does in an eager
                loop).
        """
        key = self.slot_key(tensor)
        found = self.slots.get(key)
        if found is None:
            with tf.init_scope(), creating_slot_variables():
                found = Slot(key, tensor.shape, tensor.dtype, state_spec or {})
                self.slots[key] = found
        elif found.shape != tensor.shape or found.residual.dtype != tensor.dtype:
            raise ValueError(
                f"gradient slot {key!r} holds a residual of {found.residual.dtype.name}"
                f"{found.shape}, but this trace passes {tensor.dtype.name}{tensor.shape}: one "
                f"traced function ran two models through one compressor; {self._advice()}")
        return found

    def residual_mass(self):
        """Sum of every residual, as a float64 scalar (for conservation checks)."""
        return tf.add_n([tf.reduce_sum(tf.cast(s.residual, tf.float64)) for s in self.slots.values()]
                        or [tf.constant(0.0, tf.float64)])
