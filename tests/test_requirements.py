"""The import-time check of Python, TensorFlow, Keras and Horovod (hvd_gradpart/requirements.py)."""
import json
import platform
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import horovod
import keras
import pytest
import tensorflow as tf

from hvd_gradpart import requirements
from hvd_gradpart.requirements import UntestedVersionWarning

ROOT = Path(__file__).resolve().parents[1]


def test_this_environment_passes_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntestedVersionWarning)
        assert requirements.check() == (tf.__version__, horovod.__version__)


def untested_warnings():
    """The messages of every UntestedVersionWarning that ``requirements.check()`` raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        requirements.check()
    return [str(w.message) for w in caught if w.category is UntestedVersionWarning]


@pytest.mark.parametrize("version, tested", [
    ("2.15.0", True), ("2.15.1", True), ("2.15.1+nv24.1", True), ("2.14.1", False),
    ("2.16.0rc1", False), ("2.16.1", False), ("3.0.0", False)])
def test_tensorflow_range(monkeypatch, version, tested):
    monkeypatch.setattr(tf, "__version__", version)
    found = untested_warnings()
    assert len(found) == (0 if tested else 1)
    assert tested or ("TensorFlow >=2.15,<2.16" in found[0] and f"found {version}" in found[0])


def test_tensorflow_2_16_with_keras_2_only_warns(monkeypatch):
    """TensorFlow 2.16+ whose tf.keras is still Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1) may work."""
    monkeypatch.setattr(tf, "__version__", "2.16.1")
    assert untested_warnings() == [
        "hvd_gradpart was tested with TensorFlow >=2.15,<2.16, found 2.16.1; it may work, but nothing here checked it."]


@pytest.mark.parametrize("version, tested", [
    ("3.9.18", True), ("3.11.9", True), ("3.8.18", False), ("3.12.1", False), ("3.13.0", False)])
def test_python_range(monkeypatch, version, tested):
    monkeypatch.setattr(platform, "python_version", lambda: version)
    assert untested_warnings() == ([] if tested else [
        f"hvd_gradpart was tested with Python >=3.9,<3.12, found {version}; it may work, but nothing here checked it."])


@pytest.mark.parametrize("keras_version, refused", [
    ("2.15.0", False), ("2.16.0", False), ("2.17.0rc0", False), ("3.0.0", True), ("3.3.3", True), ("3.10.0", True)])
def test_keras_3_is_refused_and_keras_2_is_not(keras_version, refused):
    message = requirements.refused_keras(keras_version, "2.16.1")
    assert (message is not None) == refused
    assert not refused or message.startswith(
        f"hvd_gradpart cannot work here: tf.keras is Keras {keras_version} (TensorFlow 2.16.1), and Horovod "
        "0.28.1 cannot train Keras 3 models")


def test_keras_3_is_refused_before_horovod_is_needed(monkeypatch):
    """With Keras 3 no Horovod build can help, so the Keras message comes first, even with Horovod missing."""
    monkeypatch.setattr(tf, "__version__", "2.16.1")
    monkeypatch.setattr(keras, "__version__", "3.3.3")
    monkeypatch.setitem(sys.modules, "horovod", None)
    with pytest.raises(ImportError) as raised:
        requirements.check()
    message = str(raised.value)
    assert message.startswith("hvd_gradpart cannot work here: tf.keras is Keras 3.3.3 (TensorFlow 2.16.1)")
    for says in ("pip install tensorflow-cpu==2.15.1", "pip install --force-reinstall --no-cache-dir "
                 "--no-build-isolation horovod==0.28.1", "TF_USE_LEGACY_KERAS=1"):
        assert says in message


def test_keras_version_is_the_package_behind_tf_keras(monkeypatch):
    assert requirements.keras_version(tf) == keras.__version__ and keras.__version__.startswith("2.15.")
    model = type("Model", (), {"__module__": "tf_keras.src.engine.training"})  # as tf_keras defines it
    legacy = SimpleNamespace(keras=SimpleNamespace(Model=model))
    monkeypatch.setitem(sys.modules, "tf_keras", SimpleNamespace(__version__="2.16.0"))
    assert requirements.keras_version(legacy) == "2.16.0"


@pytest.mark.parametrize("version, tested", [
    ("0.28.1", True), ("0.28.2", True), ("0.28.0", False), ("0.27.2", False), ("0.29.0", False)])
def test_horovod_range(monkeypatch, version, tested):
    monkeypatch.setattr(horovod, "__version__", version)
    found = untested_warnings()
    assert len(found) == (0 if tested else 1)
    assert tested or ("Horovod >=0.28.1,<0.29" in found[0] and f"found {version}" in found[0])


@pytest.mark.parametrize("missing, says", [
    ("tensorflow", "pip install tensorflow-cpu==2.15.1, or tensorflow==2.15.1 for GPUs"),
    ("horovod", "HOROVOD_WITH_TENSORFLOW=1"),
    ("horovod.tensorflow", "--force-reinstall"),
])
def test_missing_piece_says_what_to_install(monkeypatch, missing, says):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now raises ImportError
    with pytest.raises(ImportError, match="hvd_gradpart needs|does not load") as raised:
        requirements.check()
    assert says in str(raised.value) and "--no-build-isolation horovod==0.28.1" in str(raised.value)


def test_unreadable_version_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot read the version 'unknown'"):
        requirements.parse("unknown")


def test_installing_into_a_built_environment_adds_no_tensorflow_or_horovod(tmp_path):
    """Issue 15: ``pip install`` of this package (with its ``harness`` extra) into an environment
    that already holds TensorFlow and Horovod resolves to this package alone and declares
    neither; offline (``--no-index``), so every requirement must already be met."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
           "--quiet", "--report", str(report), f"{ROOT}[harness]"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    install = json.loads(report.read_text())["install"]
    assert [item["metadata"]["name"].lower() for item in install] == ["hvd-gradpart"], install
    # Already-installed requirements never show in the list, so the declared ones are checked too:
    # a TensorFlow or Horovod there would pull a second TensorFlow beside a GPU or vendor build.
    declared = [r.lower() for r in install[0]["metadata"].get("requires_dist", [])]
    assert not [r for r in declared if r.startswith(("tensorflow", "horovod"))], declared
