"""Pacing across ranks: what a paced compressor hands on, plus what it still
holds, is what the same compressor unpaced delivers, and every rank holds
the same pacing state.

Two Top-k compressors, one paced, take the same rank-dependent gradients
step by step (their residuals, and so their selections, stay equal: pacing
acts after the exchange only), under ``hvd.allreduce`` with Average.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart import TopKCompressor

RANK, SIZE = init()
N, STEPS = 4096, 30

plain, paced = TopKCompressor(ratio=0.01), TopKCompressor(ratio=0.01, pace=True)


@tf.function
def step(grad):
    return (hvd.allreduce(grad, op=hvd.Average, compression=plain),
            hvd.allreduce(grad, op=hvd.Average, compression=paced))


delivered, handed = np.zeros(N), np.zeros(N)
rng = np.random.default_rng(RANK)
for _ in range(STEPS):
    sent, out = step(tf.constant(rng.normal(size=N) * np.linspace(0.1, 2.0, N), tf.float32))
    delivered += sent.numpy()
    handed += out.numpy()
(pacer,) = [s.pacer for s in paced.memory.slots.values()]
held = pacer.held.numpy().astype(np.float64)
check(np.allclose(handed + held, delivered, atol=1e-4), "paced output + held != unpaced output")
check(np.abs(held).sum() > 0 and np.abs(handed - delivered).max() > 1e-3,
      "pacing changed nothing: the test would not see a pacer that only passes sums through")
assert_same_on_all_ranks([handed, pacer.held.numpy(), pacer.rate.numpy(), pacer.age.numpy()],
                         "paced output and pacing state")
ok(f"pacing checks passed on {SIZE} ranks")
