"""Python, TensorFlow, Keras and Horovod: what hvd_gradpart needs, checked once at import.

The package installs neither TensorFlow nor Horovod (setup.py leaves both to
the user, as Horovod itself does): the TensorFlow build is the user's choice
(``tensorflow``, ``tensorflow-cpu``, a vendor build), and Horovod is compiled
at install time against the TensorFlow already present, so a pip dependency
on either would pull a second TensorFlow beside the user's or force a Horovod
rebuild.

``check`` runs from ``hvd_gradpart/__init__.py`` before anything else
imports them, and refuses with ``ImportError`` what cannot work, saying what
to install and how: a missing TensorFlow or Horovod, a Horovod whose
TensorFlow extension does not load, and a ``tf.keras`` that is Keras 3 (the
default from TensorFlow 2.16 on). Horovod 0.28.1, its last release, cannot
train a Keras 3 model: ``DistributedGradientTape`` and the Keras
``DistributedOptimizer`` key gradients by ``Variable.ref()``, which Keras 3
variables lack, and Keras 3's ``fit`` applies gradients without calling the
optimizer methods in which Horovod's Keras wrapper reduces them. Versions
outside the tested ranges that may work only warn (``UntestedVersionWarning``):
Python outside 3.9-3.11 (TensorFlow 2.15's wheels; setup.py refuses to
install there, an import from a clone still gets this far), a TensorFlow
outside 2.15 whose ``tf.keras`` is still Keras 2 (older releases, or 2.16+
with the ``tf-keras`` package and ``TF_USE_LEGACY_KERAS=1``), a Horovod
outside 0.28.1-0.28.x. An environment that got this far already imports
``horovod.tensorflow``, so its pairing was built and may well work; refusing
it would block users on an untested but working build, while the warning
names the versions these tests ran on.
"""
import platform
import re
import sys
import warnings

# Versions the test suite ran on: [low, high) per component tuple.
PYTHON_RANGE = ((3, 9), (3, 12))  # the CPython versions TensorFlow 2.15 ships wheels for
TENSORFLOW_RANGE = ((2, 15), (2, 16))  # tested 2.15.1; 2.16 makes tf.keras Keras 3
HOROVOD_RANGE = ((0, 28, 1), (0, 29))  # 0.28.1, Horovod's last release
KERAS_REFUSED_FROM = (3,)  # a tf.keras from Keras 3 on: Horovod 0.28.1 cannot train its models

_TENSORFLOW_2_15 = "pip install tensorflow-cpu==2.15.1, or tensorflow==2.15.1 for GPUs (Python 3.9-3.11)"
_BUILD_HOROVOD = (
    "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
    "pip install --no-cache-dir --no-build-isolation horovod==0.28.1 (it compiles against the "
    "installed TensorFlow: needs cmake<4, g++ and, for MPI, an MPI library such as Debian's "
    "libopenmpi-dev; `horovodrun --check-build` must then list TensorFlow)")
_REBUILD_HOROVOD = _BUILD_HOROVOD.replace("pip install", "pip install --force-reinstall")
_NO_TENSORFLOW = (
    "hvd_gradpart needs TensorFlow {want}, which it does not install (the build is yours to "
    "choose): " + _TENSORFLOW_2_15 + "; then build Horovod against it: " + _BUILD_HOROVOD)
_NO_HOROVOD = "hvd_gradpart needs Horovod {want} built with TensorFlow; install it after TensorFlow: " + _BUILD_HOROVOD
_NO_EXTENSION = (
    "Horovod {version} is installed but horovod.tensorflow does not load ({error}); it was "
    "built without TensorFlow or against another TensorFlow. Rebuild it against this one "
    "(TensorFlow {tf_version}): " + _REBUILD_HOROVOD)
_KERAS_3 = (
    "hvd_gradpart cannot work here: tf.keras is Keras {keras} (TensorFlow {tf_version}), and "
    "Horovod 0.28.1 cannot train Keras 3 models (its DistributedGradientTape and Keras "
    "DistributedOptimizer call Variable.ref(), which Keras 3 variables lack, and Keras 3's fit "
    "never calls the optimizer methods where Horovod reduces gradients). Use TensorFlow 2.15, "
    "whose tf.keras is Keras 2: " + _TENSORFLOW_2_15 + "; then rebuild Horovod against it: "
    + _REBUILD_HOROVOD + ". Untested alternative: keep this TensorFlow, install the tf-keras "
    "release that matches it and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported.")


class UntestedVersionWarning(UserWarning):
    """Python, TensorFlow or Horovod is outside the versions hvd_gradpart was tested on."""


def parse(version):
    """The leading numeric components of a version string: ``"2.16.0rc1"`` -> ``(2, 16, 0)``.

    Raises:
        ValueError: ``version`` does not start with a number.
    """
    found = re.match(r"\d+(\.\d+)*", str(version))
    if not found:
        raise ValueError(f"cannot read the version {version!r}")
    return tuple(int(part) for part in found.group().split("."))


def describe(bounds):
    """``((2, 15), (2, 16))`` -> ``">=2.15,<2.16"``."""
    low, high = (".".join(map(str, b)) for b in bounds)
    return f">={low},<{high}"


def untested(name, version, bounds):
    """A warning text when ``version`` of ``name`` is outside ``bounds``, else None."""
    low, high = bounds
    if low <= parse(version) < high:
        return None
    return (f"hvd_gradpart was tested with {name} {describe(bounds)}, found {version}; it may work, "
            "but nothing here checked it.")


def refused_keras(keras_version, tf_version):
    """The ``ImportError`` text when ``tf.keras`` is a Keras Horovod 0.28.1 cannot train, else None."""
    if parse(keras_version) < KERAS_REFUSED_FROM:
        return None
    return _KERAS_3.format(keras=keras_version, tf_version=tf_version)


def keras_version(tf):
    """The version of the Keras that ``tf.keras`` is: ``keras`` itself, ``tf_keras`` or Keras 3.

    ``tf.keras`` has no ``__version__`` of its own in TensorFlow 2.15; the
    package that defines its ``Model`` class has one.
    """
    return sys.modules[tf.keras.Model.__module__.split(".")[0]].__version__


def check():
    """Imports TensorFlow and Horovod's TensorFlow extension; warns on untested versions.

    Returns:
        ``(tensorflow version, horovod version)``.

    Raises:
        ImportError: TensorFlow or Horovod is missing, Horovod's TensorFlow
            extension does not load, or ``tf.keras`` is Keras 3; the message
            says what to install.
    """
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(_NO_TENSORFLOW.format(want=describe(TENSORFLOW_RANGE))) from e
    refusal = refused_keras(keras_version(tf), tf.__version__)
    if refusal:
        raise ImportError(refusal)
    try:
        import horovod
    except ImportError as e:
        raise ImportError(_NO_HOROVOD.format(want=describe(HOROVOD_RANGE))) from e
    try:
        import horovod.tensorflow  # noqa: F401  (loads the compiled extension)
    except (ImportError, OSError, tf.errors.NotFoundError) as e:
        raise ImportError(_NO_EXTENSION.format(version=horovod.__version__, tf_version=tf.__version__,
                                               error=f"{type(e).__name__}: {e}")) from e
    for name, version, bounds in (("Python", platform.python_version(), PYTHON_RANGE),
                                  ("TensorFlow", tf.__version__, TENSORFLOW_RANGE),
                                  ("Horovod", horovod.__version__, HOROVOD_RANGE)):
        message = untested(name, version, bounds)
        if message:
            warnings.warn(message, UntestedVersionWarning, stacklevel=2)
    return tf.__version__, horovod.__version__
