"""Keras checkpoint callbacks carry the compressor's state (``keras_state.track``).

Under ``model.fit`` with ``horovod.tensorflow.keras.DistributedOptimizer``, a
run stopped after epoch ``STOP`` and resumed from Keras's own checkpoint
(``ModelCheckpoint`` TF-format weights, then ``BackupAndRestore`` after a
crash) ends bit-identical to an uninterrupted run: weights, every residual,
prediction and step counter. The checkpoint holds the live residual mass.
Control: the same resume without the state tracked ends elsewhere.

Usage: ``horovodrun -np 2 python keras_checkpoint_check.py WORKDIR``.
"""
import functools
import sys

import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, gather_np, init, ok
from hvd_gradpart import GradPartCompressor, keras_state

RANK, SIZE = init()
WORK = f"{sys.argv[1]}/rank{RANK}"  # every rank checkpoints its own residuals
EPOCHS, STOP, BATCH = 4, 2, 16
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def data():
    rs = np.random.RandomState(10 + RANK)
    return rs.randn(8 * BATCH, 32).astype(np.float32), rs.randint(0, 10, 8 * BATCH).astype(np.int32)


def build(compression, tracked=True):
    """A fresh process's model, optimizer and compressor (same seed every time)."""
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(128, activation="tanh"),
                                 tf.keras.layers.Dense(10)])
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9), compression=compression)
    if tracked:
        keras_state.track(opt, compression)
    model.compile(optimizer=opt, loss=LOSS)
    return model


def fit(model, epochs, callbacks=(), initial_epoch=0):
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])


def state(model, comp):
    """Weights, then every compressor variable in a fixed order."""
    arrays = [v.numpy() for v in model.trainable_variables]
    for key in sorted(comp.memory.slots):
        slot = comp.memory.slots[key]
        arrays.append(slot.residual.numpy())
        arrays += [slot.state[name].numpy() for name in sorted(slot.state)]
        arrays += [slot.metrics.variable.numpy()] if slot.metrics.variable is not None else []
    return arrays


def identical(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class Crash(tf.keras.callbacks.Callback):
    """Stops training like a killed process, at the start of epoch ``at``."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("simulated crash")


def saved_residuals(path):
    reader = tf.train.load_checkpoint(path)
    return [reader.get_tensor(n) for n in sorted(reader.get_variable_to_shape_map()) if "/residual/" in n]


# A link-following trajectory depends on measured times and cannot repeat bit for bit: the rule alone.
Compressor = functools.partial(GradPartCompressor, follow_link=False)

# Uninterrupted reference.
comp = Compressor()
model = build(comp)
fit(model, EPOCHS)
reference = state(model, comp)
check(len(comp.memory.slots) == 2, f"expected 2 sparsified gradients, got {sorted(comp.memory.slots)}")
residuals = [s.residual.numpy() for s in comp.memory.slots.values()]
check(all(np.any(r != 0) for r in residuals), "a residual is all zero: nothing to lose, nothing tested")
check(not np.array_equal(*gather_np(residuals[0])[:2]), "ranks hold the same residual (broadcast?)")
assert_same_on_all_ranks([v.numpy() for v in model.trainable_variables], "uninterrupted weights")

# ModelCheckpoint (TF-format weights), stop after STOP epochs, resume in a new model.
first = Compressor()
model = build(first)
fit(model, STOP, [tf.keras.callbacks.ModelCheckpoint(f"{WORK}/mc/ckpt-{{epoch}}", save_weights_only=True)])
path = f"{WORK}/mc/ckpt-{STOP}"
saved = saved_residuals(path)
live = [s.residual.numpy() for s in first.memory.slots.values()]
check(len(saved) == len(live) == 2 and all(any(np.array_equal(r, s) for s in saved) for r in live),
      f"the checkpoint holds {len(saved)} residuals, not the compressor's {len(live)} live ones")
comp = Compressor()
model = build(comp)
model.load_weights(path)
fit(model, EPOCHS, initial_epoch=STOP)
check(identical(state(model, comp), reference), "ModelCheckpoint resume differs from the uninterrupted run")
ok("ModelCheckpoint resume: bit-identical weights, residuals, predictions and counters")

# The control: the same resume with the compressor untracked loses its state and diverges.
comp = Compressor()
model = build(comp, tracked=False)
model.load_weights(path)
fit(model, EPOCHS, initial_epoch=STOP)
check(not identical(state(model, comp), reference), "an untracked resume matched: the check proves nothing")
ok("control: a resume without the compressor state diverges")

# BackupAndRestore: a crash at the start of epoch STOP, then the same fit call again.
backup = tf.keras.callbacks.BackupAndRestore(f"{WORK}/backup")
model = build(Compressor())
try:
    fit(model, EPOCHS, [backup, Crash(STOP)])
    check(False, "the simulated crash did not happen")
except RuntimeError as e:
    check("simulated crash" in str(e), f"unexpected error {e}")
comp = Compressor()
model = build(comp)
fit(model, EPOCHS, [tf.keras.callbacks.BackupAndRestore(f"{WORK}/backup")])
check(identical(state(model, comp), reference), "BackupAndRestore resume differs from the uninterrupted run")
ok("BackupAndRestore resume after a crash: bit-identical")
ok(f"keras checkpoint checks passed on {SIZE} ranks")
