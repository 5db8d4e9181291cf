"""The link budget's decisions from the figures every rank shares: pure Python, one place.

``update`` takes one step's figures, averaged over ranks (``clock.step_figures`` on each
rank, reduced through the marker) and returns the state with the next steps' price and mode.
Every rank folds the same figures in the same order, so every rank decides alike. The state
is a flat list of floats (``State.vector``) so it can live in one checkpointed variable.
"""
import dataclasses
import math

from hvd_gradpart.budget import bandwidth, mode, price
from hvd_gradpart.budget.clock import smoothed


@dataclasses.dataclass
class State:
    """What the controller knows; every field is a float (seconds, counts, nats)."""

    step_id: float = 0.0        # the last step folded in (each is folded once)
    price: float = 0.0          # nats added to every area's position cost
    dense: float = 0.0          # 1: the next steps hand Horovod the gradient
    sparse_steps: float = 0.0   # sparse steps seen (the first is not measured)
    dense_steps: float = 0.0    # dense steps seen
    sparse_s: float = 0.0       # a sparse step's wall time (smoothed)
    dense_s: float = 0.0        # a dense step's wall time (smoothed, 0 until one ran)
    other_s: float = 0.0        # a sparse step's time beside its exposed link time (smoothed)
    compress_s: float = 0.0     # ... of which its compress passes (smoothed)
    since_dense_s: float = 0.0  # sparse seconds since the last dense step (a probe's allowance)
    least_s: float = 0.0        # the least sparse link time: a collective's fixed cost (drifting up)
    payload_s: float = 0.0      # what a sparse payload adds to that (smoothed)
    values: float = 0.0         # values a sparse step sends (smoothed)
    value_bytes: float = 0.0    # bytes a sent value costs, all counted (smoothed)
    dense_link_s: float = 0.0   # a dense step's link time (smoothed)
    elements: float = 0.0       # elements a step exchanges
    link_value_s: float = 0.0   # the link seconds a sent value costs (the link line's last slope)
    work_value_s: float = 0.0   # the CPU seconds a sent value adds to a step (the work line's last slope)
    share: float = 0.0          # the share of a sparse step's time its values cost, last sparse step
    fit: list = dataclasses.field(default_factory=lambda: [0.0] * 5)       # faded sums: 1, v, link, v*v, v*link
    work_fit: list = dataclasses.field(default_factory=lambda: [0.0] * 5)  # ... 1, v, work, v*v, v*work

    LINES = ("fit", "work_fit")  # the list fields, five floats each, last in the vector

    def vector(self):
        scalars = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.LINES]
        return [float(v) for v in scalars + [x for name in self.LINES for x in getattr(self, name)]]

    @classmethod
    def of(cls, vector):
        vector = [float(v) for v in vector]
        scalars = len(vector) - 5 * len(cls.LINES)
        lines = {name: vector[scalars + 5 * i:scalars + 5 * (i + 1)] for i, name in enumerate(cls.LINES)}
        return cls(*vector[:scalars], **lines)


def update(state, figures, config):
    """``state`` after the shared ``figures`` of one step (``clock.step_figures``'s keys, plus
    ``step_id``); a step already folded in, or one with no known duration, changes nothing
    but the step id."""
    if figures["step_id"] <= state.step_id:
        return state
    state = dataclasses.replace(state, step_id=figures["step_id"])
    step_s, link_s = figures["step_s"], figures["link_s"]
    if step_s <= 0.0 or figures["elements"] <= 0.0:
        return state
    state.elements = figures["elements"]
    # a sparse step's first also builds its branch (tracing, compiling): it is counted, not measured
    if figures["dense"] > 0.5:
        state.dense_steps += 1
        state.since_dense_s = 0.0
        state.dense_s = smoothed(state.dense_s, step_s, config)
        bandwidth.observe_dense(state, link_s, config)
    else:
        state.sparse_steps += 1
        if state.sparse_steps > 1:
            fold_sparse(state, figures, config)
    state.dense = 1.0 if dense_next(state, config) else 0.0
    return state


def dense_next(state, config):
    """The next steps' mode. A mode holds until a step of its own was measured (a sparse step's
    first only builds its branch). A dense step is priced at what dense steps measured. Before
    one did, a dense step is tried (a probe, two steps: its figures come back a step late) only
    when it would win at the bandwidth the sparse steps tell (at no byte cost while they tell
    nothing), and even at their own throughput (a lower bound of the bandwidth) the probe
    costs at most ``probe_share`` of the sparse time so far."""
    dense_now = state.dense > 0.5
    if (state.dense_steps < 1 and dense_now) or (state.sparse_steps <= config.fit_steps and not dense_now):
        return dense_now
    if state.dense_steps >= 1:
        return mode.dense_next(dense_now, state.dense_s, state.sparse_s, config)
    work = max(state.other_s - state.compress_s, 0.0)
    told = bandwidth.dense_link_s(state, config) if bandwidth.told(state, config) else state.least_s
    at_worst = work + bandwidth.dense_link_s(state, config, lower_bound=True)
    return (mode.dense_next(dense_now, work + told, state.sparse_s, config)
            and 2 * at_worst <= config.probe_share * state.since_dense_s)


def fold_sparse(state, figures, config):
    """Folds a sparse step's figures into ``state`` and moves the price."""
    step_s, link_s = figures["step_s"], figures["link_s"]
    state.since_dense_s += step_s
    work_s = max(step_s - link_s, 0.0)
    paused = state.other_s > 0.0 and work_s > config.paused_at * state.other_s
    state.sparse_s = smoothed(state.sparse_s, step_s, config)
    state.other_s = smoothed(state.other_s, work_s, config)
    state.compress_s = smoothed(state.compress_s, min(figures["compress_s"], work_s), config)
    bandwidth.observe_sparse(state, None if paused else work_s, link_s, figures["values"], figures["sent_bytes"],
                             config)
    if figures["values"] > 0.0:
        state.share = price.value_share(bandwidth.step_value_s(state, config), state.values, state.sparse_s)
        state.price = price.moved(state.price, state.share, config, capped=figures["capped"])


def report(state, config):
    """The state as a dict for logs (times in ms, bandwidth in MB/s)."""
    per_value = bandwidth.value_s(state, config)
    return {"dense": state.dense > 0.5, "price_nats": state.price, "steps": int(state.step_id),
            "step_ms": 1e3 * state.sparse_s, "dense_step_ms": 1e3 * state.dense_s,
            "other_ms": 1e3 * state.other_s, "fixed_ms": 1e3 * state.least_s, "values": state.values,
            "bandwidth_MBps": state.value_bytes / per_value / 1e6 if per_value > 0.0 else math.inf,
            "value_us": 1e6 * bandwidth.step_value_s(state, config), "value_share": state.share}
