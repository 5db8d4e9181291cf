"""Dense or sparse: whether Horovod's allreduce of the whole gradient makes more progress per second.

A sparse step is counted as ``sparse_worth`` of a dense one (error feedback delays what it
leaves, it does not drop it), so a dense step is taken while it is at most ``1 /
sparse_worth`` times as long as a sparse one: on fast links, where compressing costs more
than the bytes it saves. A mode is left only once the other wins by ``hysteresis``.
"""


def dense_next(dense_now, dense_s, sparse_s, config):
    """Whether the next steps go dense, from the two modes' step times (seconds)."""
    if dense_s <= 0.0 or sparse_s <= 0.0:
        return dense_now
    advantage = sparse_s / (config.sparse_worth * dense_s)  # > 1: dense makes more progress per second
    return advantage > 1.0 / config.hysteresis if dense_now else advantage > config.hysteresis
