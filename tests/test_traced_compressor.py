"""A compressor built inside a traced step (Horovod's synthetic benchmark does so) keeps its residuals."""
import pytest

from conftest import horovodrun

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


def test_compressor_built_inside_tf_function():
    out = horovodrun("traced_compressor_check.py", np=2, backend="gloo", timeout=300)
    assert "OK a compressor built inside a tf.function traced twice keeps its residuals" in out
