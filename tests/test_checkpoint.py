"""Compressor state (residuals, predictions, counters) survives tf.train.Checkpoint."""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_gradpart import GradPartCompressor

hvd.init()


def grads(step):
    return tf.constant(np.random.RandomState(step).laplace(0, 1e-3, 8192).astype(np.float32))


def run(comp, steps):
    fn = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    return [fn(grads(s)).numpy() for s in steps]


def test_resume_reproduces_the_uninterrupted_trajectory(tmp_path):
    # the rule alone: a link-following trajectory depends on measured times, so it cannot repeat
    uninterrupted = GradPartCompressor(follow_link=False)
    straight = run(uninterrupted, range(6))

    first = GradPartCompressor(follow_link=False)
    run(first, range(3))
    path = tf.train.Checkpoint(compressor=first).save(str(tmp_path / "ckpt"))
    resumed = GradPartCompressor(follow_link=False)
    tf.train.Checkpoint(compressor=resumed).restore(path)
    after = run(resumed, range(3, 6))

    for a, b in zip(after, straight[3:]):
        np.testing.assert_array_equal(a, b)
    slot = next(iter(resumed.memory.slots.values()))
    assert slot.state["prediction"].numpy()[3] == 6.0  # Prediction.steps
    twin = next(iter(uninterrupted.memory.slots.values()))
    np.testing.assert_array_equal(slot.residual.numpy(), twin.residual.numpy())
    np.testing.assert_array_equal(slot.state["prediction"].numpy(), twin.state["prediction"].numpy())


def test_the_link_budget_is_restored_with_the_residuals(tmp_path):
    first = GradPartCompressor()
    run(first, range(4))
    (step, budget), = first.budgets.items()
    assert budget.read()["steps"] == 2  # a step's figures come back with the next, are folded at the one after
    path = tf.train.Checkpoint(compressor=first).save(str(tmp_path / "ckpt"))
    resumed = GradPartCompressor()
    tf.train.Checkpoint(compressor=resumed).restore(path)  # before the first step, as a job resumes
    run(resumed, [4])
    assert list(resumed.budgets) == [step]
    assert resumed.budgets[step].read()["steps"] == 3  # the figures saved with the checkpoint were folded
    assert resumed.budgets[step].read()["step_ms"] > 0.0  # the saved measurements came back


def test_a_dense_step_hands_over_the_gradient_with_a_quarter_of_the_residual():
    from hvd_gradpart.budget import controller

    comp = GradPartCompressor()
    step = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    for s in range(3):  # sparse steps leave a residual
        step(grads(s))
    (budget,) = comp.budgets.values()
    slot = next(iter(comp.memory.slots.values()))
    residual = slot.residual.numpy()
    assert np.any(residual)
    # a link where dense steps were measured far faster than sparse ones: the next step is dense
    state = controller.State.of(budget.state.numpy())
    state.dense, state.dense_steps, state.dense_s, state.sparse_s = 1.0, 5.0, 1e-6, 1.0
    budget.state.assign(state.vector())
    out = step(grads(3)).numpy()
    np.testing.assert_allclose(out, grads(3).numpy() + 0.25 * residual, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(slot.residual.numpy(), 0.75 * residual, rtol=1e-6)  # nothing lost
    assert budget.read()["dense"]
