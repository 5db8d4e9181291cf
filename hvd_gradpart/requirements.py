"""TensorFlow and Horovod: what hvd_gradpart needs, checked once at import.

The package installs neither (setup.py leaves both to the user, as Horovod
itself does): the TensorFlow build is the user's choice (``tensorflow``,
``tensorflow-cpu``, a vendor build), and Horovod is compiled at install time
against the TensorFlow already present, so a pip dependency on either would
pull a second TensorFlow beside the user's or force a Horovod rebuild.

``check`` runs from ``hvd_gradpart/__init__.py`` before anything else
imports them. A missing TensorFlow, a missing Horovod, or a Horovod whose
TensorFlow extension does not load raises ``ImportError`` saying what to
install and how. A version outside the tested range only warns
(``UntestedVersionWarning``): an environment that got this far already
imports ``horovod.tensorflow``, so its pairing was built and may well work;
refusing it would block users on an untested but working build, while the
warning names the versions these tests ran on.
"""
import re
import warnings

# Versions the test suite ran on: [low, high) per component tuple.
TENSORFLOW_RANGE = ((2, 15), (2, 16))  # tested 2.15.1; 2.16 makes tf.keras Keras 3
HOROVOD_RANGE = ((0, 28, 1), (0, 29))  # 0.28.1, Horovod's last release

_BUILD_HOROVOD = (
    "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
    "pip install --no-cache-dir --no-build-isolation horovod==0.28.1 (it compiles against the "
    "installed TensorFlow: needs cmake<4, g++ and, for MPI, an MPI library such as Debian's "
    "libopenmpi-dev; `horovodrun --check-build` must then list TensorFlow)")
_NO_TENSORFLOW = (
    "hvd_gradpart needs TensorFlow {want}, which it does not install (the build is yours to "
    "choose): pip install tensorflow-cpu==2.15.1, or tensorflow==2.15.1 for GPUs; then build "
    "Horovod against it: " + _BUILD_HOROVOD)
_NO_HOROVOD = "hvd_gradpart needs Horovod {want} built with TensorFlow; install it after TensorFlow: " + _BUILD_HOROVOD
_NO_EXTENSION = (
    "Horovod {version} is installed but horovod.tensorflow does not load ({error}); it was "
    "built without TensorFlow or against another TensorFlow. Rebuild it against this one "
    "(TensorFlow {tf_version}): " + _BUILD_HOROVOD.replace("pip install", "pip install --force-reinstall"))


class UntestedVersionWarning(UserWarning):
    """TensorFlow or Horovod is outside the versions hvd_gradpart was tested on."""


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
    note = (" From TensorFlow 2.16 on, tf.keras is Keras 3, which horovod.tensorflow.keras 0.28 "
            "does not support." if name == "TensorFlow" and parse(version) >= (2, 16) else "")
    return (f"hvd_gradpart was tested with {name} {describe(bounds)}, found {version}; it may work, "
            f"but nothing here checked it.{note}")


def check():
    """Imports TensorFlow and Horovod's TensorFlow extension; warns on untested versions.

    Returns:
        ``(tensorflow version, horovod version)``.

    Raises:
        ImportError: TensorFlow or Horovod is missing, or Horovod's TensorFlow
            extension does not load; the message says what to install.
    """
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(_NO_TENSORFLOW.format(want=describe(TENSORFLOW_RANGE))) from e
    try:
        import horovod
    except ImportError as e:
        raise ImportError(_NO_HOROVOD.format(want=describe(HOROVOD_RANGE))) from e
    try:
        import horovod.tensorflow  # noqa: F401  (loads the compiled extension)
    except (ImportError, OSError, tf.errors.NotFoundError) as e:
        raise ImportError(_NO_EXTENSION.format(version=horovod.__version__, tf_version=tf.__version__,
                                               error=f"{type(e).__name__}: {e}")) from e
    for name, version, bounds in (("TensorFlow", tf.__version__, TENSORFLOW_RANGE),
                                  ("Horovod", horovod.__version__, HOROVOD_RANGE)):
        message = untested(name, version, bounds)
        if message:
            warnings.warn(message, UntestedVersionWarning, stacklevel=2)
    return tf.__version__, horovod.__version__
