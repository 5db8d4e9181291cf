"""Compressor state inside Horovod's elastic state.

Horovod's elastic training (``@hvd.elastic.run`` with ``TensorFlowKerasState``
or ``KerasState``) copies the model and optimizer to host memory at each
``commit``, puts them back (``restore``) when a rank fails, and after any
change in the set of ranks (a *reset*) broadcasts rank 0's copy to every rank,
new ones included. A compressor holds two kinds of state. *Rank-local*: each
rank's residuals (the gradient mass it has not sent yet) and per-gradient
method state (GradPart's predicted fit and step count), made from its own
gradients. *Shared*: what every rank derives from the same gathered sums and
must hold alike, the link budget (``hvd_gradpart.budget``), the last sum
handed to a momentum optimizer (``hvd_gradpart.momentum``) and the keyed exchange's
rates and prediction (``SHARED_STATE``). ``track`` adds the
rank-local state and that sum to the commit: a ``restore`` puts every residual
back to its value at the same commit as the weights, and a residual made since
that commit back to zero, so no step's gradient is applied twice (once through
the restored weights' steps that are re-run, once more through a newer
residual). On every reset the shared state restarts on every rank: the budget
measures the links again (they are not the links it measured) and the last
sums are forgotten, so that surviving ranks and joining ones, which build
theirs fresh on their first step, hold the same state.

What a reset means for the gradient: a rank that leaves takes its residuals
with it, mass that was delayed and is now lost (``unsent_norm`` measures it;
docs/reliability.md gives the figures). A joining rank starts from empty
residuals and a fresh fit, as at a job's start. The exchange and the marker
read the number of ranks as the graph runs (``exchange.world_size``), so the
traced step is reused across the change and stays exact.

``run`` stands in for ``hvd.elastic.run``. Horovod 0.28.1's decorator takes a
TensorFlow error for a lost rank only when its message names
``HorovodAllreduce``, ``HorovodAllgather`` or ``HorovodBroadcast``; a step
whose gradients travel in groups (``groups=``, the sparse exchange's fast
path) fails in ``HorovodGroupedAllreduce``, and Horovod's decorator then
returns None without a word: the surviving ranks leave training as if it had
ended. ``run`` recognises every Horovod collective and re-raises any other
error.
"""
import re
import zlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.common.elastic import State, run_fn
from horovod.common.exceptions import HorovodInternalError

from hvd_gradpart.budget import Budget
from hvd_gradpart.metrics import resolve

ATTRIBUTE = "_gradient_compression_states"
COLLECTIVE = re.compile(r"Horovod(Grouped)?(Allreduce|Allgather|Broadcast|Alltoall|Reducescatter)")


class CompressorState:
    """The rank-local state of one compressor as of the last commit.

    Args:
        compressor: a sparse compressor instance.
    """

    def __init__(self, compressor):
        self.compressor = compressor
        self.saved = {}  # slot key -> values of its rank-local variables at the last commit

    def save(self):
        """Copies every slot's rank-local variables (with the weights, at a commit)."""
        self.saved = {key: [tf.identity(var) for var in slot.committed()]
                      for key, slot in self.compressor.memory.slots.items()}

    def restore(self):
        """Puts every slot back to the last commit; a slot made since then back to its start."""
        for key, slot in self.compressor.memory.slots.items():
            if key not in self.saved:
                slot.reset()
                continue
            for var, value in zip(slot.committed(), self.saved[key]):
                var.assign(value)

    def restart_shared(self):
        """Restarts every link budget of the compressor, forgets the last sums handed to the
        optimizer and restarts the state every rank derives alike (``SHARED_STATE``: the keyed
        exchange's rates and prediction), at a reset, on every rank: a joining rank holds none."""
        for module in self.compressor.submodules:
            if isinstance(module, Budget):
                module.restart()
        for slot in self.compressor.memory.slots.values():
            slot.forget_delivered()
            slot.restart(self.compressor.SHARED_STATE)


def track(state, compression):
    """Makes a Horovod elastic state commit and restore ``compression`` with the model.

    Args:
        state: ``hvd.elastic.TensorFlowKerasState``, ``hvd.elastic.KerasState`` or any
            other ``horovod.common.elastic.State``, made before ``@hvd.elastic.run`` starts.
        compression: what the model's ``DistributedOptimizer`` or
            ``DistributedGradientTape`` was given: an instance, a class (its default
            instance is tracked) or one of Horovod's dense compressors (nothing to track).

    Returns:
        ``state``.

    Raises:
        ValueError: ``state`` is not a Horovod elastic state.
    """
    if not isinstance(state, State):
        raise ValueError(f"track expects the state passed to an @hvd.elastic.run function (e.g. "
                         f"hvd.elastic.TensorFlowKerasState(model, optimizer)), got {type(state).__name__}")
    instance = resolve(compression)
    tracked = state.__dict__.setdefault(ATTRIBUTE, [])
    if instance is None or any(part.compressor is instance for part in tracked):
        return state
    part = CompressorState(instance)
    tracked.append(part)
    save, restore = state.save, state.restore

    def save_with_compressor():
        save()
        part.save()

    def restore_with_compressor():
        restore()
        part.restore()

    state.save, state.restore = save_with_compressor, restore_with_compressor
    state.register_reset_callbacks([part.restart_shared])
    part.save()
    return state


def run(func):
    """``hvd.elastic.run`` for TensorFlow, recognising a lost rank in any Horovod collective.

    Args:
        func: the training function; its first argument is the elastic state.

    Returns:
        The function to call with the state: it syncs the state, runs ``func``, and on a
        lost rank or a change of hosts resets Horovod and runs it again.
    """
    def guarded(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as e:
            if COLLECTIVE.search(e.message):
                raise HorovodInternalError(e) from e
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return run_fn(guarded, reset)


def unsent_norm(compression):
    """The L2 norm of every residual of ``compression`` on this rank: the gradient mass it
    would take with it if it left now (0.0 for a dense compressor)."""
    instance = resolve(compression)
    slots = instance.memory.slots.values() if instance is not None else ()
    return float(np.sqrt(sum(np.sum(np.square(slot.residual.numpy(), dtype=np.float64)) for slot in slots)))


def fingerprint(variables):
    """A CRC-32 of the bytes of ``variables``: equal on two ranks when their values are."""
    crc = 0
    for var in variables:
        crc = zlib.crc32(np.ascontiguousarray(var.numpy()).tobytes(), crc)
    return crc
