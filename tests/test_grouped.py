"""The grouped exchange (one allgather per Horovod group) on Gloo and MPI."""
import pytest

from conftest import horovodrun

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_grouped_exchange(backend):
    out = horovodrun("grouped_check.py", np=2, backend=backend, timeout=600)
    assert "OK a traced step holds one allgather per Horovod group" in out
    assert "OK ranks whose groups disagree stop with a clear error" in out
    assert "OK grouped checks passed on 2 ranks" in out
