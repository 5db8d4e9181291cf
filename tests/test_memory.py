"""Residual identity and checkpointing of Memory, in one process."""
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart.memory import Memory


def test_keys_follow_call_order_and_survive_retrace():
    memory = Memory()
    seen = []

    @tf.function
    def f(x):
        a = memory.slot(tf.zeros([4]))
        b = tf.cond(tf.reduce_sum(x) > 0, lambda: memory.slot(tf.zeros([3])).residual + 0,
                    lambda: tf.zeros([3]))
        seen.append(a.key)
        return a.residual + 0, b

    f(tf.constant([1.0]))
    f(tf.constant([1.0, 2.0]))  # new shape: a retrace
    assert f.experimental_get_tracing_count() >= 2
    assert sorted(memory.slots) == ["f/0", "f/1"]
    assert set(seen) == {"f/0"} and len(seen) >= 2


def test_eager_slots_are_keyed_by_shape_and_dtype():
    memory = Memory()
    assert memory.slot(tf.zeros([2, 3])) is memory.slot(tf.ones([2, 3]))
    assert memory.slot(tf.zeros([6])) is not memory.slot(tf.zeros([2, 3]))
    assert sorted(memory.slots) == ["eager/float32/2x3", "eager/float32/6"]


def test_a_different_tensor_at_a_known_position_is_refused():
    memory = Memory()
    shape = [4]

    @tf.function
    def train_step(x):
        return memory.slot(tf.zeros(shape)).residual + x

    train_step(tf.constant(1.0))
    shape[0] = 5  # the same function retraced for another model (an eager loop through Horovod's trace)
    with pytest.raises(ValueError, match="new compressor instance"):
        train_step(tf.constant([1.0]))


def test_checkpoint_restores_residuals_even_before_they_exist(tmp_path):
    memory = Memory()
    memory.slot(tf.zeros([3])).residual.assign([1.0, -2.0, 3.0])
    path = tf.train.Checkpoint(memory=memory).save(str(tmp_path / "ckpt"))

    fresh = Memory()
    tf.train.Checkpoint(memory=fresh).restore(path)
    np.testing.assert_array_equal(fresh.slot(tf.zeros([3])).residual.numpy(), [1.0, -2.0, 3.0])


def test_residual_mass_sums_every_slot():
    memory = Memory()
    memory.slot(tf.zeros([2])).residual.assign([1.0, 2.0])
    memory.slot(tf.zeros([3])).residual.assign([0.5, 0.5, 0.5])
    assert memory.residual_mass().numpy() == 4.5
