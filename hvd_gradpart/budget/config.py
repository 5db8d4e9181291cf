"""The link budget's settings: one documented place (none is a user setting)."""
from typing import NamedTuple


class Config(NamedTuple):
    """What the link budget's parts assume; every field has its reason."""

    smoothing: float = 0.8        # weight of the past in a step's measured times and counts
    pause_factor: float = 4.0     # a step counts at most this many smoothed steps (evaluations pause)
    paused_at: float = 2.0        # a step whose own work is this many smoothed ones paused: no point on the work line
    least_drift: float = 1.005    # the least link time seen (a collective's fixed cost) may rise this much a step
    fading: float = 0.9           # weight of the past in the (values, link time) line (about 10 steps)
    fit_steps: float = 5.0        # faded steps the line needs ...
    fit_spread: float = 0.25      # ... and the spread of their values (std over mean), for a slope
    elasticity: float = 0.15      # steps to accuracy fall as density ** -elasticity (the Top-k grid's cells:
                                  # 0.07-0.18), so the values sent cost this share of a step at the optimum
    gain: float = 1.0             # price move (nats) per e-fold of the values' share of the step over that
    max_move: float = 0.25        # the most the price moves in one step, nats: density changes smoothly
    starved_move: float = 2.0     # ... and what it falls while the density floor holds (a start)
    capped_at: float = 1.1        # offered over sent values beyond which the ceiling holds ...
    offer_limit: float = 3.0      # ... and beyond which the price rises (each candidate costs a compaction)
    price_limit: float = 20.0     # the price stays in [-limit, +limit] nats (a position among 1e8 costs 18.4)
    sparse_worth: float = 0.8     # a sparse step's progress, as a share of a dense one's, for the mode choice
    hysteresis: float = 1.2       # a mode is left only once the other wins by this factor
    probe_share: float = 0.05     # a probe (a dense step to measure the link) costs at most this share of
                                  # the sparse time before it, at the payloads' own throughput
    drain: float = 0.25           # the share of the residual a dense step flushes into the gradient
    dense_bytes_per_element: float = 4.0  # float32 values of Horovod's dense allreduce


DEFAULT = Config()
