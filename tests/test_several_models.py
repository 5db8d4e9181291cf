"""Several models in one process, each on residual slots of its own (``hvd_gradpart.memory``).

The unit tests drive ``Memory`` from ``tf.function``s shaped like the ones
Horovod and Keras trace; the Keras and Horovod cases, with every sparse
method, run on two ranks in ``tests/parallel/several_models_check.py``.
"""
import numpy as np
import pytest
import tensorflow as tf

from conftest import horovodrun
from hvd_gradpart.compressors import COMPRESSORS, BaseCompressor
from hvd_gradpart.memory import Memory

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


def test_steps_made_from_one_python_function_get_their_own_slots():
    memory = Memory()

    def make_step(shape):
        def step():
            return memory.slot(tf.zeros(shape)).residual + 0
        return tf.function(step)

    first = make_step([4])
    for step in (first, make_step([5]), make_step([4]), first):
        step()
    assert list(memory.slots) == ["step/0", "step#2/0", "step#3/0"]
    assert memory.slots["step/0"].residual is not memory.slots["step#3/0"].residual  # same shapes


def test_a_function_traced_inside_steps_gets_slots_per_step_and_signature():
    """Horovod's cached allreduce function under Keras: retraced for a second model on a later
    call (which must still create its slots), and twice in one step for a GAN's two optimizers."""
    memory = Memory()

    @tf.function
    def allreduce(grads):
        return [memory.slot(g).residual + g for g in grads]

    def make_step(*shapes):
        return tf.function(lambda: allreduce([tf.zeros(s) for s in shapes]))

    first = make_step([4])
    first()
    make_step([5], [2])()
    make_step([3])()
    halves = tf.function(lambda: (allreduce([tf.zeros([6])]), allreduce([tf.zeros([7])])))
    halves()
    first()
    assert list(memory.slots) == ["allreduce/0", "allreduce#2/0", "allreduce#2/1", "allreduce#3/0",
                                  "allreduce#4/0", "allreduce#5/0"]
    assert [memory.slots[k].shape for k in ("allreduce#4/0", "allreduce#5/0")] == [[6], [7]]


class Model:
    """A Keras model's shape: ``compile`` makes a new step, ``fit`` runs it."""

    def __init__(self, allreduce):
        self.allreduce = allreduce

    def compile(self):
        self.step = tf.function(lambda: self.allreduce(tf.ones([4])))

    def fit(self):
        return self.step()


def test_a_cached_trace_fails_at_once_for_another_models_step():
    memory = Memory("TopKCompressor")
    allreduce = tf.function(lambda g: memory.slot(g).residual + g)
    model = Model(allreduce)
    model.compile()
    model.fit()
    model.compile()  # recompiled: its new step runs the same trace, the same slots
    model.fit()
    other = Model(allreduce)
    other.compile()
    with pytest.raises(ValueError, match=r"residuals of another model's step.*compression=TopKCompressor\(\)"):
        other.fit()  # same shapes: the cached trace, untraced, would hand it the first model's slots
    assert list(memory.slots) == ["_lambda_/0"]
    model.fit()


def test_keys_of_later_steps_are_restored_from_a_checkpoint_before_they_exist(tmp_path):
    def run(memory, values=None):
        make_step = lambda: tf.function(lambda: memory.slot(tf.zeros([3])).residual + 0)
        steps = [make_step(), make_step()]
        for step in steps:
            step()
        if values:
            for slot, value in zip(memory.slots.values(), values):
                slot.residual.assign(value)
        return {k: s.residual.numpy() for k, s in memory.slots.items()}

    saved = Memory()
    expected = run(saved, [[1.0, 2.0, 3.0], [-4.0, 5.0, -6.0]])
    path = tf.train.Checkpoint(memory=saved).save(str(tmp_path / "ckpt"))
    fresh = Memory()
    tf.train.Checkpoint(memory=fresh).restore(path)
    restored = run(fresh)
    assert list(restored) == list(expected) == ["_lambda_/0", "_lambda_#2/0"]
    for key in expected:
        np.testing.assert_array_equal(restored[key], expected[key])


def test_every_method_gives_each_model_its_own_slots_on_two_ranks():
    out = horovodrun("several_models_check.py", np=2, backend="gloo", timeout=600)
    assert "OK several-models checks passed on 2 ranks" in out
    for name, method in COMPRESSORS.items():
        if isinstance(method, type) and issubclass(method, BaseCompressor):
            for case in ("Keras fit", "train_on_batch", "Embedding", "tape loops"):
                assert f"OK {name}: {case}" in out, (name, case)
            assert f"OK {name}: two models of the same shapes" in out, name
    assert "a second Keras model of the same shapes through the class fails at once" in out
