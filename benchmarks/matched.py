"""Exact Top-k at the density another method sent: two selection rules' step times at one density."""
import horovod.tensorflow as hvd

from hvd_gradpart import COMPRESSORS, BaseCompressor

# The methods a matched Top-k is set beside: every sparse selection rule but Top-k itself.
SELECTION_RULES = {name for name, c in COMPRESSORS.items() if issubclass(c, BaseCompressor) and name != "topk"}


def matched_topk(method, density):
    """The method (name, compressor, kwargs) of exact Top-k at ``method``'s ``density``, rank 0's,
    so that every rank builds the same compressor."""
    return f"topk@{method}", "topk", {"ratio": hvd.broadcast_object(density, 0)}
