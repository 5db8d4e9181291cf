"""Models build and run; datasets load offline from their standard formats."""
import gzip
import os
import pickle

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from harness.data import (DATASETS, DataNotFoundError, batches, load_dataset,  # noqa: E402
                          shard)
from harness.models import MODELS, PixelTokens, build_model  # noqa: E402

SHAPES = {"mlp": [(28, 28, 1), (8, 8, 1)], "lenet5": [(28, 28, 1), (8, 8, 1)],
          "resnet20": [(32, 32, 3), (28, 28, 1)], "embedding": [(28, 28, 1), (8, 8, 1)],
          "resnet44": [(32, 32, 3)], "mobilenetv2": [(28, 28, 1), (8, 8, 1)]}


# ---------------------------------------------------------------- models

def test_every_model_has_shapes_under_test():
    assert set(SHAPES) == set(MODELS)


@pytest.mark.parametrize("name,shape", [(n, s) for n in MODELS for s in SHAPES[n]])
def test_model_outputs_logits_per_class(name, shape):
    model = build_model(name, shape, num_classes=7, seed=0)
    out = model(np.random.default_rng(0).random((3, *shape), dtype=np.float32), training=False)
    assert out.shape == (3, 7)
    assert np.all(np.isfinite(out.numpy()))


def test_mlp_parameter_count():
    model = build_model("mlp", (28, 28, 1), 10, seed=0)
    assert model.count_params() == 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10


@pytest.mark.parametrize("name", MODELS)
def test_models_are_seeded(name):
    def weights(seed):
        return [w.numpy() for w in build_model(name, (8, 8, 1), 10, seed=seed).weights]

    a, b, c = weights(3), weights(3), weights(4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))


def test_resnet44_has_over_100_gradient_tensors():
    model = build_model("resnet44", (32, 32, 3), 10, seed=0)
    convolutions = [v for v in model.trainable_variables if len(v.shape) == 4]
    assert (len(model.trainable_variables), len(convolutions)) == (137, 45)


def test_mobilenetv2_has_its_158_gradient_tensors():
    model = build_model("mobilenetv2", (28, 28, 1), 10, seed=0)
    convolutions = [v for v in model.trainable_variables if len(v.shape) == 4]
    depthwise = [v for v in convolutions if v.shape[-1] == 1 and v.shape[0] == 3]
    assert (len(model.trainable_variables), len(convolutions), len(depthwise)) == (158, 52, 17)


def test_pixel_tokens_are_position_times_levels_plus_level():
    image = np.array([0.0, 1.0, 0.5, 0.99], np.float32).reshape(1, 2, 2, 1)
    np.testing.assert_array_equal(PixelTokens(16)(image).numpy(), [[0, 16 + 15, 32 + 8, 48 + 15]])


def test_embedding_gradient_is_indexed_slices():
    model = build_model("embedding", (8, 8, 1), 10, seed=0)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    with tf.GradientTape() as tape:
        loss = tf.keras.losses.sparse_categorical_crossentropy([0, 1, 2, 3], model(x), from_logits=True)
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(model.layers[2], tf.keras.layers.Embedding)
    assert model.trainable_variables[0].shape == (64 * 16, 16)
    assert isinstance(grads[0], tf.IndexedSlices)
    assert all(isinstance(g, tf.Tensor) for g in grads[1:])


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="mlp.*lenet5.*resnet20.*embedding.*resnet44.*mobilenetv2"):
        build_model("vgg", (28, 28, 1), 10, seed=0)


# ---------------------------------------------------------------- shipped datasets

def _check(ds, n_train, n_test, shape):
    assert ds.x_train.shape == (n_train, *shape) and ds.x_test.shape == (n_test, *shape)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert ds.y_test.dtype == np.int32 and ds.num_classes == 10
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0


def test_mnist5k_is_balanced_and_seeded():
    ds = load_dataset("mnist5k", seed=0)
    _check(ds, 4000, 1000, (28, 28, 1))
    assert ds.x_train.max() == 1.0
    np.testing.assert_array_equal(np.bincount(ds.y_train), [400] * 10)
    np.testing.assert_array_equal(np.bincount(ds.y_test), [100] * 10)
    again, other = load_dataset("mnist5k", seed=0), load_dataset("mnist5k", seed=1)
    np.testing.assert_array_equal(ds.x_train, again.x_train)
    np.testing.assert_array_equal(ds.y_test, again.y_test)
    assert not np.array_equal(ds.y_train, other.y_train)


def test_digits():
    ds = load_dataset("digits", seed=0)
    _check(ds, 1437, 360, (8, 8, 1))
    assert ds.x_train.max() == 1.0 and ds.name == "digits"
    assert np.bincount(ds.y_test).min() >= 35


def test_synthetic_is_seeded_and_sized():
    ds = load_dataset("synthetic", seed=5, synthetic_shape=(4, 4, 3), synthetic_size=(20, 6))
    _check(ds, 20, 6, (4, 4, 3))
    again = load_dataset("synthetic", seed=5, synthetic_shape=(4, 4, 3), synthetic_size=(20, 6))
    np.testing.assert_array_equal(ds.x_train, again.x_train)


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match="mnist5k.*digits.*mnist.*cifar10.*synthetic"):
        load_dataset("imagenet")
    assert "synthetic" in DATASETS


# ---------------------------------------------------------------- local files

def _write_idx(path, array, magic, gz):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with (gzip.open if gz else open)(f"{path}.gz" if gz else path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _write_mnist(folder, gz, n_train=6, n_test=4):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x, y = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        _write_idx(folder / f"{split}-images-idx3-ubyte", x, 2051, gz)
        _write_idx(folder / f"{split}-labels-idx1-ubyte", y, 2049, gz)
        arrays[split] = x, y
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_idx_files(tmp_path, gz):
    arrays = _write_mnist(tmp_path, gz)
    ds = load_dataset("mnist", data_dir=tmp_path)
    _check(ds, 6, 4, (28, 28, 1))
    np.testing.assert_allclose(ds.x_train[..., 0] * 255, arrays["train"][0], atol=1e-3)
    np.testing.assert_array_equal(ds.y_test, arrays["t10k"][1])


def test_mnist_default_folder_from_env(tmp_path, monkeypatch):
    _write_mnist(tmp_path / "mnist", gz=True)
    monkeypatch.setenv("HVD_GRADPART_DATA", str(tmp_path))
    assert load_dataset("mnist").x_test.shape == (4, 28, 28, 1)


def test_mnist_rejects_wrong_magic(tmp_path):
    _write_mnist(tmp_path, gz=False)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(6), 2051, gz=False)
    with pytest.raises(ValueError, match="magic"):
        load_dataset("mnist", data_dir=tmp_path)


def test_mnist_missing_file_names_path(tmp_path):
    with pytest.raises(DataNotFoundError, match=str(tmp_path / "train-images-idx3-ubyte")) as err:
        load_dataset("mnist", data_dir=tmp_path)
    assert isinstance(err.value, FileNotFoundError) and "\n" not in str(err.value)


def _write_cifar(root, n=3):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
                 b"labels": rng.integers(0, 10, n).tolist(), b"batch_label": name.encode()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
        written[name] = batch
    return written


def test_cifar10_reads_pickle_batches(tmp_path):
    written = _write_cifar(tmp_path)
    ds = load_dataset("cifar10", data_dir=tmp_path)
    _check(ds, 15, 3, (32, 32, 3))
    red = written["data_batch_1"][b"data"][0, :1024].reshape(32, 32)
    np.testing.assert_allclose(ds.x_train[0, :, :, 0] * 255, red, atol=1e-3)
    np.testing.assert_array_equal(ds.y_test, written["test_batch"][b"labels"])


def test_cifar10_missing_file_names_path(tmp_path):
    with pytest.raises(DataNotFoundError, match="cifar-10-batches-py") as err:
        load_dataset("cifar10", data_dir=tmp_path)
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in str(err.value)


# ---------------------------------------------------------------- shards and batches

@pytest.mark.parametrize("n,size", [(10, 3), (12, 4), (7, 1), (5, 5)])
def test_shards_are_equal_disjoint_and_cover_all_but_remainder(n, size):
    x, y = np.arange(n) * 10, np.arange(n)
    shards = [shard(x, y, r, size) for r in range(size)]
    assert {len(sx) for sx, _ in shards} == {n // size}
    taken = np.concatenate([sy for _, sy in shards])
    assert len(set(taken)) == len(taken) == n // size * size
    assert all(np.array_equal(sx, sy * 10) for sx, sy in shards)


def test_shard_rejects_bad_arguments():
    x = np.arange(4)
    for rank, size in ((2, 2), (-1, 2), (0, 5)):
        with pytest.raises(ValueError):
            shard(x, x, rank, size)


def test_batches_are_full_shuffled_and_deterministic():
    x, y = np.arange(10, dtype=np.float32)[:, None], np.arange(10, dtype=np.int32)

    def epoch(seed, e):
        return [(bx.numpy(), by.numpy()) for bx, by in batches(x, y, 3, seed, e)]

    first = epoch(0, 0)
    assert len(first) == 3 and all(by.shape == (3,) for _, by in first)
    assert all(np.array_equal(bx[:, 0], by) for bx, by in first)
    labels = np.concatenate([by for _, by in first])
    assert len(set(labels)) == 9
    assert np.array_equal(labels, np.concatenate([by for _, by in epoch(0, 0)]))
    assert not np.array_equal(labels, np.concatenate([by for _, by in epoch(0, 1)]))
    with pytest.raises(ValueError):
        batches(x, y, 11, 0, 0)
