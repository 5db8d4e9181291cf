"""The compressor inside Horovod's elastic state (one process): a restore puts every
residual back to the commit of the weights it goes with, never a newer one."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import GradPartCompressor, elastic
from hvd_gradpart.budget import Budget

hvd.init()


def setup(compressor, warm=True):
    """A two-layer model, legacy SGD, and a step that runs every gradient through
    ``compressor`` (one process: Horovod's tape would skip compression); ``warm`` runs a
    first step, which makes the optimizer's slots and the compressor's."""
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(32)])
    model.build((None, 48))
    opt = tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip([compressor.decompress(*compressor.compress(g)) for g in grads],
                                model.trainable_variables))

    if warm:
        step(batch(-1))
    return model, opt, step


def batch(i):
    return tf.constant(np.random.RandomState(i + 10).normal(size=(16, 48)).astype(np.float32))


def residuals(compressor):
    return [slot.residual.numpy().copy() for slot in compressor.memory.slots.values()]


def run_and_restore(track):
    """Commits after step 0, runs steps 1-2, restores (as a failed rank makes every survivor
    do) and runs steps 1-2 again; returns the residuals after each pass and the weights."""
    comp = GradPartCompressor(follow_link=False)
    model, opt, step = setup(comp)
    state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0)
    if track:
        elastic.track(state, comp)
    step(batch(0))
    state.commit()
    committed = residuals(comp)
    for i in (1, 2):
        step(batch(i))
    first = residuals(comp), [w.numpy() for w in model.weights]
    state.restore()
    restored = residuals(comp)
    for i in (1, 2):
        step(batch(i))
    return committed, restored, first, (residuals(comp), [w.numpy() for w in model.weights])


def test_a_restore_brings_back_the_residuals_of_the_restored_weights():
    committed, restored, first, again = run_and_restore(track=True)
    assert any(np.any(r != 0) for r in committed)
    for a, b in zip(restored, committed):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(first[0] + first[1], again[0] + again[1]):  # the re-run steps repeat exactly
        np.testing.assert_array_equal(a, b)


def test_without_track_the_restore_keeps_a_newer_residual():
    """The control: Horovod's state alone restores the weights only, so the re-run steps meet
    residuals that already hold their gradients (applied twice), and end elsewhere."""
    committed, restored, first, again = run_and_restore(track=False)
    assert any(np.any(a != b) for a, b in zip(restored, committed))
    assert any(np.any(a != b) for a, b in zip(first[1], again[1]))


def test_a_slot_made_after_the_last_commit_is_restored_empty():
    comp = GradPartCompressor(follow_link=False)
    model, opt, step = setup(comp, warm=False)
    state = elastic.track(hvd.elastic.TensorFlowKerasState(model, opt), comp)  # commits nothing yet
    step(batch(0))
    assert any(np.any(r != 0) for r in residuals(comp))
    state.restore()
    for slot in comp.memory.slots.values():
        np.testing.assert_array_equal(slot.residual.numpy(), 0)
        assert slot.state["prediction"].numpy().tolist() == [0.0, 1.0, 2.0, 0.0]  # mu, alpha, beta, steps


def test_a_reset_restarts_the_link_budget_on_every_rank():
    comp = GradPartCompressor()
    model, opt, step = setup(comp)
    for i in range(3):
        step(batch(i))
    state = elastic.track(hvd.elastic.TensorFlowKerasState(model, opt), comp)
    (budget,) = comp.budgets.values()
    assert budget.read()["steps"] >= 1
    residual = residuals(comp)
    state.on_reset()
    new = Budget()  # what a joining rank makes at its first step
    assert budget.state.numpy().tolist() == new.state.numpy().tolist()
    assert not budget.shared.numpy().any() and not any(s.numpy().any() for s in budget.stamps.values())
    for a, b in zip(residual, residuals(comp)):  # a rank's own residual stays through a reset
        np.testing.assert_array_equal(a, b)


def test_track_refuses_what_is_not_an_elastic_state():
    with pytest.raises(ValueError, match=r"hvd.elastic.TensorFlowKerasState\(model, optimizer\)"):
        elastic.track(object(), GradPartCompressor())


def test_dense_compression_has_nothing_to_track():
    model, opt, _ = setup(GradPartCompressor(follow_link=False))
    state = hvd.elastic.TensorFlowKerasState(model, opt)
    assert elastic.track(state, hvd.Compression.fp16) is state
    assert elastic.unsent_norm(hvd.Compression.none) == 0.0


def test_unsent_norm_and_fingerprint():
    comp = GradPartCompressor(follow_link=False)
    model, _, step = setup(comp)
    norm = np.sqrt(sum(np.sum(r.astype(np.float64) ** 2) for r in residuals(comp)))
    assert elastic.unsent_norm(comp) == pytest.approx(norm) and norm > 0
    before = elastic.fingerprint(model.weights)
    assert elastic.fingerprint(model.weights) == before
    step(batch(0))
    assert elastic.fingerprint(model.weights) != before


def failing_once(message):
    """A training function that fails once with ``tf.errors.UnknownError(message)``, then returns
    the number of calls; and the state it runs on, which counts its restores."""
    calls = []

    def train(state):
        calls.append(state.batch)
        if len(calls) == 1:
            state.batch = 7  # uncommitted progress
            raise tf.errors.UnknownError(None, None, message)
        return len(calls)

    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, batch=0)
    return train, state, calls


def test_run_sees_a_rank_lost_in_a_grouped_collective(monkeypatch):
    """Horovod 0.28.1's decorator looks for HorovodAllreduce/Allgather/Broadcast only: on this
    error it returns None and training ends as if it had finished."""
    resets = []
    monkeypatch.setattr(hvd, "shutdown", lambda: resets.append("shutdown"))  # one process: MPI cannot
    monkeypatch.setattr(hvd, "init", lambda: resets.append("init"))  # start again once finalized
    message = "Graph execution error: Detected at node DistributedGradientTape_Allreduce/cond/HorovodGroupedAllreduce_x"
    train, state, calls = failing_once(message)
    assert hvd.elastic.run(train)(state) is None and calls == [0]  # Horovod's: silently over
    train, state, calls = failing_once(message)
    assert elastic.run(train)(state) == 2
    assert calls == [0, 0]  # the second call started from the restored state
    assert resets == ["shutdown", "init"]


def test_run_lets_any_other_error_through():
    train, state, _ = failing_once("a bug in the training step")
    with pytest.raises(tf.errors.UnknownError, match="a bug in the training step"):
        elastic.run(train)(state)
