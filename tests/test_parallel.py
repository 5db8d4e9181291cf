"""Multi-rank checks: each launches a script under horovodrun on localhost."""
import pytest

from conftest import horovodrun

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_exchange_is_exact(backend):
    out = horovodrun("exchange_check.py", np=2, backend=backend)
    assert "OK exchange checks passed on 2 ranks" in out
    assert "OK a rank selecting nothing finishes" in out


def test_exchange_on_three_ranks():
    assert "OK exchange checks passed on 3 ranks" in horovodrun("exchange_check.py", np=3)


def test_training_through_horovod_wrappers():
    out = horovodrun("training_check.py", np=2, timeout=400)
    assert "OK training checks passed on 2 ranks" in out


@pytest.mark.parametrize("case", ["settings", "model"])
def test_ranks_that_disagree_stop_with_a_clear_error(case):
    out = horovodrun("mismatch_check.py", np=2, args=[case], timeout=120)
    assert "DETECTED rank 0" in out and "DETECTED rank 1" in out
