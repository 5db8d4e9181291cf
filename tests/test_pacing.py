"""Pacing hands each delivered sum on at the rate it built up, and loses nothing."""
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart.pacing import Pacer


def released(deliveries, dtype=tf.float64):
    """The pacer's output for each row of ``deliveries`` (steps x elements), and the pacer."""
    pacer = Pacer(deliveries.shape[1], dtype)
    return np.stack([pacer.release(tf.constant(row, dtype)).numpy() for row in deliveries]), pacer


def test_a_sum_built_over_three_steps_is_handed_on_over_three():
    # Delivered at step 2 (ages 0, 1, 2 before it): 6 / 3 per step at steps 2, 3 and 4.
    out, pacer = released(np.array([[0.0], [0.0], [6.0], [0.0], [0.0], [0.0]]))
    np.testing.assert_array_equal(out[:, 0], [0, 0, 2, 2, 2, 0])
    assert pacer.held.numpy()[0] == 0


def test_a_coordinate_sent_every_step_passes_straight_through():
    deliveries = np.array([[1.5, -2.0], [-0.25, 3.0], [4.0, -1.0]])
    out, _ = released(deliveries)
    np.testing.assert_array_equal(out, deliveries)


def test_a_new_delivery_spreads_what_is_still_held_with_it():
    # 8 at step 3 (rate 2), 2 handed on; 4 more at step 4 (age 0): 6 + 4 = 10 held, rate 10 / 1.
    out, _ = released(np.array([[0.0], [0.0], [0.0], [8.0], [4.0], [0.0]]))
    np.testing.assert_array_equal(out[:, 0], [0, 0, 0, 2, 10, 0])


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
def test_what_is_handed_on_plus_what_is_held_is_what_was_delivered(dtype):
    rng = np.random.default_rng(0)
    deliveries = rng.normal(size=(200, 64)) * (rng.random((200, 64)) < 0.1)
    out, pacer = released(deliveries.astype(dtype.as_numpy_dtype), dtype)
    total = out.astype(np.float64).sum(0) + pacer.held.numpy().astype(np.float64)
    tol = {tf.float16: 2e-2, tf.float32: 1e-5, tf.float64: 1e-12}[dtype]
    np.testing.assert_allclose(total, deliveries.astype(dtype.as_numpy_dtype).sum(0), atol=tol * 20)
    # Never more is handed on than was held: the sign of what is left never flips.
    assert np.all(np.abs(out) <= np.abs(deliveries).sum(0) + tol)
