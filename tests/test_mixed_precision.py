"""Mixed precision under every registered compressor, on two ranks (``parallel/mixed_precision_client.py``).

An overflow on one rank only, as dynamic loss scaling makes now and then, must do what it does
under Horovod's dense allreduce: the sum is not finite on every rank, every rank's
``LossScaleOptimizer`` skips that step and halves its scale, nothing raises or hangs, and
training goes on with finite, bit-identical weights. The fast tier runs the tape with one method
of each kind (Horovod's own, a sparse rule, GradPart's link budget, PowerSGD's in-compress
sums); the whole suite runs every method, tape and ``fit``, Gloo and MPI, four ranks, and a
NaN without loss scaling (the user's own, which must reach every rank and hang none).
"""
import pytest

from conftest import horovodrun
from hvd_gradpart import COMPRESSORS

EVERY = sorted(COMPRESSORS)
ONE_OF_EACH_KIND = ["none", "topk", "gradpart", "powersgd"]


def run(mode, backend, names, np=2):
    out = horovodrun("mixed_precision_client.py", np=np, backend=backend, timeout=600,
                     args=["--mode", mode, "--compression", *names])
    for name in names:
        assert f"OK {mode} {name} " in out, out[-3000:]


def test_tape_overflow_on_one_rank_skips_the_step_everywhere():
    run("tape", "gloo", ONE_OF_EACH_KIND)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.parametrize("mode", ["tape", "fit"])
def test_every_compressor_under_loss_scaling(mode, backend):
    run(mode, backend, EVERY)


@pytest.mark.slow
def test_four_ranks_skip_the_step_one_of_them_overflowed():
    run("tape", "gloo", ONE_OF_EACH_KIND, np=4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_nan_without_loss_scaling_reaches_every_rank_and_hangs_none(backend):
    run("plain", backend, EVERY)
