"""PowerSGD on two local ranks, Gloo and MPI (tests/parallel/powersgd_check.py)."""
import pytest

from conftest import horovodrun

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_powersgd_is_exact_and_bit_identical_on_two_ranks(backend):
    out = horovodrun("powersgd_check.py", np=2, backend=backend, timeout=400)
    assert "OK powersgd checks passed on 2 ranks" in out, out[-3000:]
