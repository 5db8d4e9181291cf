"""Ranks that disagree on the model or on compressor settings stop with a clear error.

    horovodrun -np 2 python mismatch_check.py settings|model

Every rank must raise (none may hang waiting for the others); each prints
``DETECTED rank R`` when the error names the disagreement.
"""
import sys

from common import hvd, init, tf

from hvd_gradpart import TopKCompressor

rank, size = init()
case = sys.argv[1]
ratio = 0.01 * (1 + rank) if case == "settings" else 0.01
n = 4096 + (rank * 1024 if case == "model" else 0)
compressor = TopKCompressor(ratio=ratio)
tape_step = tf.function(lambda g: hvd.allreduce(g, compression=compressor))
try:
    tape_step(tf.ones([n])).numpy()
except tf.errors.InvalidArgumentError as e:
    if "ranks disagree" in str(e) and "same compressor settings" in str(e):
        print(f"DETECTED rank {rank}", flush=True)
        sys.exit(0)
    raise
print(f"NOT DETECTED rank {rank}", flush=True)
sys.exit(1)
