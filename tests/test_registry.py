"""Every registered compression method trains on two ranks (one horovodrun launch)."""
import pytest

from conftest import horovodrun

from hvd_gradpart.compressors import COMPRESSORS

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


def test_every_registered_method_trains_bit_identically_on_two_ranks():
    out = horovodrun("registry_check.py", np=2, backend="gloo", timeout=400)
    for name in [*COMPRESSORS, "variance/microbatches"]:
        assert f"OK {name}: ranks bit-identical" in out, name
    assert f"OK registry checks passed for {len(COMPRESSORS) + 1} methods on 2 ranks" in out
