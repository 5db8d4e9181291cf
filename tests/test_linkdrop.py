"""The link-drop benchmark without a cluster: its reduction of one run's step records."""
import pytest

from benchmarks import linkdrop as ld


def steps(times, link=None):
    return [{"step": i + 1, "interval_s": t, **({"link": link(i + 1)} if link else {})} for i, t in enumerate(times)]


def test_a_method_that_follows_the_drop_recovers_and_one_that_does_not_never_does():
    drop = 60  # the step in flight at the change
    follows = [0.02] * (drop - 1) + [0.1] * 10 + [0.025] * 100  # back near 20 ms ten steps after
    stays = [0.02] * (drop - 1) + [0.1] * 110
    fast = ld.analyse(steps(follows), drop)
    assert fast["before_s"] == 0.02 and fast["after_s"] == 0.025
    assert fast["ratio"] == pytest.approx(1.25)
    assert fast["recovered_after_steps"] == 21  # once the 20-step median holds 11 fast steps
    assert fast["worst_after_s"] == 0.1
    slow = ld.analyse(steps(stays), drop)
    assert slow["ratio"] == pytest.approx(5.0) and slow["recovered_after_steps"] is None


def test_the_link_state_of_each_side_is_summarised():
    state = lambda step: {"density": 0.004 if step < 60 else 0.001, "dense": step < 10}
    out = ld.analyse(steps([0.02] * 170, state), 60)
    assert out["link_before"] == {"density": 0.004, "dense_steps": 0}
    assert out["link_after"] == {"density": 0.001, "dense_steps": 0}
    assert "density" not in ld.analyse(steps([0.02] * 170), 60)["link_before"]


def test_too_few_steps_around_the_drop_is_an_error():
    with pytest.raises(ValueError, match="run more --steps"):
        ld.analyse(steps([0.02] * 90), 60)


@pytest.mark.parametrize("argv, message", [
    (["--after", "10mb"], "rate '10mb'"),
    (["--drop-at", "10"], "--drop-at must be"),
    (["--methods", "nosuch"], "not registered"),
])
def test_bad_arguments_say_what_to_do(argv, message, capsys):
    with pytest.raises(SystemExit):
        ld.parse_args(argv)
    assert message in capsys.readouterr().err
