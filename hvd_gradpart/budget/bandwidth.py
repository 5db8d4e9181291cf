"""Bandwidth estimate: what a sent value costs on the link and in the step, and what a dense step would.

A sparse collective costs a fixed part (Horovod's cycle, the latency and negotiation of its
rounds) and a part that grows with the payload. Sparse steps fit a line ``link = fixed +
values * c`` through their recent (values sent, link time) points, fading old ones: its
slope ``c`` is a value's link time, which no single step can tell apart from the fixed part.
While the values vary too little for a slope, the estimate is the last slope found or, when
more, what a step's link time adds beyond the least one seen (drifting up slowly) over its
values: a link that slows shows there before the values vary. Payloads too small to show read
as free: the price then buys more, until they show or the density ceiling holds. A second
line through (values sent, the step's own work: its time beside its link time; a step that
paused, for an evaluation, adds no point) gives the CPU work a value adds (compaction, coding,
every rank's decode); its last slope holds while the values vary too little to tell a new
one, and it counts as 0 until one was told. A dense step is priced at what dense steps
measured, else at the sparse estimate for every element's bytes.
"""
from hvd_gradpart.budget.clock import smoothed


def observe_sparse(state, work_s, link_s, values, sent_bytes, config):
    """Folds a sparse step's own work (None: it paused), link time, values and bytes into ``state``."""
    state.least_s = link_s if state.least_s <= 0.0 else min(link_s, config.least_drift * state.least_s)
    seen = state.sparse_steps > 2
    state.fit, state.link_value_s = fitted(state.fit, state.link_value_s, values, link_s, seen, config)
    if work_s is not None:
        state.work_fit, state.work_value_s = fitted(state.work_fit, state.work_value_s, values, work_s, seen, config)
    state.payload_s = smoothed_raw(state.payload_s, max(link_s - state.least_s, 0.0), config, seen)
    state.values = smoothed_raw(state.values, values, config, seen)
    if values > 0.0:
        state.value_bytes = smoothed(state.value_bytes, sent_bytes / values, config)


def observe_dense(state, link_s, config):
    """Folds a dense step's link time into ``state``."""
    state.dense_link_s = smoothed_raw(state.dense_link_s, link_s, config, state.dense_steps > 1)


def smoothed_raw(old, new, config, seen):
    """An exponential average that starts at the first observation (``seen``: one came before)."""
    return config.smoothing * old + (1 - config.smoothing) * new if seen else new


def fitted(sums, last_slope, values, seconds, seen, config):
    """A line's sums with one more (values, seconds) point, the old ones faded (the first
    alone while none was ``seen``), and its slope (``last_slope`` while none is told)."""
    point = (1.0, values, seconds, values * values, values * seconds)
    sums = [config.fading * m + p for m, p in zip(sums, point)] if seen else list(point)
    found = slope(sums, config)
    return sums, last_slope if found is None else found


def slope(sums, config):
    """The slope of the line through the faded ``sums`` (seconds per value), or None while the
    values vary too little to tell it from the fixed cost."""
    w, v, l, vv, vl = sums
    if w < config.fit_steps:
        return None
    mean_v, mean_l = v / w, l / w
    spread = vv / w - mean_v ** 2
    if spread <= 0.0 or spread < (config.fit_spread * mean_v) ** 2:
        return None
    return max((vl / w - mean_v * mean_l) / spread, 0.0)


def told(state, config):
    """Whether the payloads told a value's link time (a slope, or time beyond the least)."""
    found = slope(state.fit, config)
    return (found is not None and found > 0.0) or state.payload_s > 0.0


def value_s(state, config):
    """Link seconds one more sent value costs: the fitted slope, else the payload's time
    beyond the least over its values (0 while payloads are too small to show)."""
    found = slope(state.fit, config)
    if found is not None:
        return found
    beyond = state.payload_s / state.values if state.values > 0.0 else 0.0
    return max(state.link_value_s, beyond)


def step_value_s(state, config):
    """Step seconds one more sent value costs: its link time and the CPU work it adds."""
    return value_s(state, config) + state.work_value_s


def dense_link_s(state, config, lower_bound=False):
    """The link time of a dense step: measured, else every element's bytes at the bandwidth
    the sparse steps tell or, with ``lower_bound``, at their payloads' own throughput (their
    whole link time counted as payload: a dense step cannot be slower)."""
    if state.dense_steps >= 1:
        return state.dense_link_s
    if state.value_bytes <= 0.0 or state.values <= 0.0:
        return float("inf")
    per_value = (state.least_s + state.payload_s) / state.values if lower_bound else value_s(state, config)
    return state.least_s + config.dense_bytes_per_element * state.elements * per_value / state.value_bytes
