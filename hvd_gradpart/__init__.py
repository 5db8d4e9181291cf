"""hvd_gradpart: adaptive gradient-partition compression for Horovod + TensorFlow."""
from hvd_gradpart import requirements

requirements.check()

from hvd_gradpart.compressors import (COMPRESSORS, BaseCompressor, DGCCompressor, GradPartCompressor,  # noqa: E402
                                      GradPartResearch, KeyedCompressor, KeyedResearch, PowerSGDCompressor,
                                      SIDCoCompressor, SparseCompressor, TopKCompressor, VarianceCompressor,
                                      get_compressor)
from hvd_gradpart.metrics import CompressionLogger, MetricsCallback, figures, snapshot, summary  # noqa: E402
from hvd_gradpart.requirements import UntestedVersionWarning  # noqa: E402

__all__ = ["COMPRESSORS", "BaseCompressor", "DGCCompressor", "GradPartCompressor", "GradPartResearch",
           "KeyedCompressor", "KeyedResearch", "PowerSGDCompressor", "SIDCoCompressor", "SparseCompressor",
           "TopKCompressor", "VarianceCompressor",
           "get_compressor",
           "CompressionLogger", "MetricsCallback", "figures", "snapshot", "summary", "UntestedVersionWarning"]
__version__ = "0.1.0"
