"""hvd_gradpart: adaptive gradient-partition compression for Horovod + TensorFlow."""
from hvd_gradpart.compressors import (COMPRESSORS, DGCCompressor, GradPartCompressor,
                                      SIDCoCompressor, SparseCompressor, TopKCompressor,
                                      VarianceCompressor, get_compressor)
from hvd_gradpart.metrics import MetricsCallback, snapshot, summary

__all__ = ["COMPRESSORS", "DGCCompressor", "GradPartCompressor", "SIDCoCompressor", "SparseCompressor",
           "TopKCompressor", "VarianceCompressor", "get_compressor",
           "MetricsCallback", "snapshot", "summary"]
__version__ = "0.1.0"
