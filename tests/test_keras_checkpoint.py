"""Compressor state in Keras checkpoints (``hvd_gradpart.keras_state``)."""
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import pytest
import tensorflow as tf

from conftest import horovodrun
from hvd_gradpart import GradPartCompressor, TopKCompressor, keras_state

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

hvd.init()


@pytest.mark.parametrize("make", [tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD])
def test_tracked_state_is_in_the_model_checkpoint_not_in_its_variables(make, tmp_path):
    comp = TopKCompressor()
    opt = keras_state.track(hvdk.DistributedOptimizer(make(0.1), compression=comp), comp)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=opt, loss="mse")
    with tf.init_scope():
        residual = comp.memory.slot(tf.zeros([64, 32])).residual  # as the first step creates it
    residual.assign(tf.range(2048, dtype=tf.float32))
    model.save_weights(str(tmp_path / "ckpt"))  # what ModelCheckpoint(save_weights_only=True) calls
    saved = {name: shape for name, shape in tf.train.list_variables(str(tmp_path / "ckpt"))
             if "/residual/" in name}
    assert list(saved.values()) == [[2048]], saved
    own = {id(v) for v in (*model.variables, *opt.variables())}
    assert id(residual) not in own, "Horovod would broadcast rank 0's residual over the others'"


def test_the_class_tracks_its_default_instance_and_dense_tracks_nothing():
    opt = keras_state.track(tf.keras.optimizers.SGD(0.1), GradPartCompressor)
    assert getattr(opt, keras_state.ATTRIBUTE) is GradPartCompressor.instance()
    plain = tf.keras.optimizers.SGD(0.1)
    assert keras_state.track(plain, hvd.Compression.none) is plain
    assert not hasattr(plain, keras_state.ATTRIBUTE)
    with pytest.raises(ValueError, match="already tracks another compressor"):
        keras_state.track(opt, GradPartCompressor())


def test_keras_resume_is_bit_identical_on_two_ranks(tmp_path):
    out = horovodrun("keras_checkpoint_check.py", np=2, args=[str(tmp_path)], timeout=400)
    assert "OK ModelCheckpoint resume: bit-identical" in out
    assert "OK control: a resume without the compressor state diverges" in out
    assert "OK BackupAndRestore resume after a crash: bit-identical" in out
