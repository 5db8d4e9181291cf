"""The compression methods, one file each, on three layers (base, sparse, linked); a registry by name."""
from horovod.tensorflow.compression import Compression

from hvd_gradpart.compressors.base import BaseCompressor
from hvd_gradpart.compressors.dgc import DGCCompressor
from hvd_gradpart.compressors.gradpart import GradPartCompressor
from hvd_gradpart.compressors.keyed import KeyedCompressor, KeyedResearch
from hvd_gradpart.compressors.powersgd import PowerSGDCompressor
from hvd_gradpart.compressors.research import GradPartResearch
from hvd_gradpart.compressors.sidco import SIDCoCompressor
from hvd_gradpart.compressors.sparse import SparseCompressor
from hvd_gradpart.compressors.topk import TopKCompressor
from hvd_gradpart.compressors.variance import VarianceCompressor

COMPRESSORS = {
    "none": Compression.none,
    "fp16": Compression.fp16,
    "topk": TopKCompressor,
    "gradpart": GradPartCompressor,
    "gradpart-keyed": KeyedCompressor,
    "variance": VarianceCompressor,
    "dgc": DGCCompressor,
    "sidco": SIDCoCompressor,
    "powersgd": PowerSGDCompressor,
}


def get_compressor(name, **kwargs):
    """The compressor registered as ``name``, configured with ``kwargs``.

    Horovod's own ``none`` and ``fp16`` take no arguments and are returned as
    classes; this package's methods return an instance, built by ``from_options``:
    a research field may be passed flat (``get_compressor("gradpart", fit=False)``).
    """
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; choose from {sorted(COMPRESSORS)}")
    method = COMPRESSORS[name]
    if not issubclass(method, BaseCompressor):
        if kwargs:
            raise ValueError(f"compressor {name!r} takes no options, got {sorted(kwargs)}")
        return method
    return method.from_options(**kwargs)
