"""PowerSGD under horovodrun: exact reductions, bit-identical ranks, Horovod's wrappers.

Expectations are computed here in numpy from every rank's input, gathered
with plain ``hvd.allgather``; inputs depend on the rank.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, gather_np, init, ok
from small_model import fit_keras, train_tape
from hvd_gradpart import PowerSGDCompressor, summary

RANK, SIZE = init()
FAN_IN, OUT = 96, 40
REDUCTIONS = [  # Horovod's allreduce options, and the factor they put on the sum over ranks
    ("average", dict(op=hvd.Average), 1.0 / SIZE),
    ("sum", dict(op=hvd.Sum), 1.0),
    ("pre/postscale", dict(op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), 1.5),
    ("average+postscale", dict(op=hvd.Average, postscale_factor=2.0), 2.0 / SIZE),
]


def close(got, want, what, rtol=1e-5):
    scale = np.abs(want).max()
    check(np.allclose(got, want, rtol=rtol, atol=rtol * scale), f"{what}: off by {np.abs(got - want).max():.3g}")


def check_rank_one_sums_are_exact():
    # Every rank's M^T is u_rank v^T with one shared v: the sum over ranks has rank one, so rank-1
    # PowerSGD must deliver the exact sum (times the reduction's factor); each rank keeps its input
    # less the mean.
    rs = np.random.RandomState(7)
    v = rs.randn(OUT)
    u = np.random.RandomState(100 + RANK).randn(FAN_IN)
    x = np.outer(u, v).astype(np.float32)
    total = gather_np(x).astype(np.float64).sum(0)
    for mode in ("eager", "function"):
        for name, kwargs, factor in REDUCTIONS:
            comp = PowerSGDCompressor(warmup_steps=0)
            run = lambda t: hvd.allreduce(t, compression=comp, **kwargs)
            got = (tf.function(run) if mode == "function" else run)(tf.constant(x)).numpy()
            close(got, factor * total, f"{mode} {name}")
            residual = next(iter(comp.memory.slots.values())).residual.numpy().reshape(x.shape)
            close(residual, x - total / SIZE, f"{mode} {name}: the residual is not the input less the mean")
            assert_same_on_all_ranks([got], f"{mode} {name} output")
    ok("rank-one sums exact for average/sum/pre-postscale, eager and tf.function")


def check_full_rank_steps_match_numpy():
    # Rank 2 on full-rank inputs, two steps. Every rank keeps its input less the mean output, so
    # the average output plus a rank's residual is that rank's input. Step 2 starts from the kept Q,
    # identical on every rank, and must equal the projection computed here from the ranks' inputs:
    # P = sum_r M_r Q, orthonormalised; output = (sum_r M_r^T) P P^T.
    for name, kwargs, factor in REDUCTIONS[:2]:
        comp = PowerSGDCompressor(rank=2, warmup_steps=0)
        run = tf.function(lambda t: hvd.allreduce(t, compression=comp, **kwargs))
        rs = np.random.RandomState(1000 + RANK)
        x1, x2 = (rs.randn(FAN_IN, OUT).astype(np.float32) for _ in range(2))
        out1 = run(tf.constant(x1)).numpy()
        slot = next(iter(comp.memory.slots.values()))
        r1, q1 = slot.residual.numpy().reshape(FAN_IN, OUT), slot.state["q"].numpy()
        assert_same_on_all_ranks([out1, q1], f"{name} step 1 output and kept Q")
        close(out1 / (factor * SIZE) + r1, x1, f"{name} step 1: mean output + residual is not the input")
        m2 = gather_np(x2 + r1).astype(np.float64)
        p = np.linalg.qr(sum(m.T @ q1 for m in m2))[0]
        want = m2.sum(0) @ p @ p.T
        out2 = run(tf.constant(x2)).numpy()
        close(out2, factor * want, f"{name} step 2 against numpy", rtol=1e-4)
        close(slot.residual.numpy().reshape(FAN_IN, OUT), x2 + r1 - want / SIZE, f"{name} step 2 residual", rtol=1e-4)
        assert_same_on_all_ranks([out2, slot.state["q"].numpy()], f"{name} step 2 output and kept Q")
    ok("full-rank steps match numpy; mean output + residual is every rank's input")


STEPS = 4


def check_tape():
    per_tensor = train_tape(PowerSGDCompressor(warmup_steps=1, min_elements=0), STEPS)
    assert_same_on_all_ranks(per_tensor, "DistributedGradientTape per tensor")
    grouped = train_tape(PowerSGDCompressor(warmup_steps=1, min_elements=0), STEPS, num_groups=1)
    assert_same_on_all_ranks(grouped, "DistributedGradientTape groups=1")
    check(all(np.array_equal(a, b) for a, b in zip(per_tensor, grouped)), "groups=1 differs from per tensor")
    dense = train_tape(hvd.Compression.none, STEPS)
    check(not np.allclose(per_tensor[0], dense[0], atol=1e-6), "the compressed run looks dense")
    warm = train_tape(PowerSGDCompressor(warmup_steps=STEPS, min_elements=0), STEPS, num_groups=1)
    check(all(np.allclose(w, d, rtol=1e-6, atol=1e-7) for w, d in zip(warm, dense)),
          "a run that is all warm-up differs from dense")
    ok("DistributedGradientTape in tf.function, per tensor and groups=1 bit-identical; warm-up is dense")


def check_keras_fit():
    comp = PowerSGDCompressor(warmup_steps=2, min_elements=0)
    assert_same_on_all_ranks(fit_keras(comp, STEPS), "keras fit")
    # 8 steps: the kernels (32x64, 64x48, 48x10) go dense twice, then as P, Q and the marker;
    # the biases always go dense, through Horovod's own allreduce (no marker).
    kernels = ((32, 64), (64, 48), (48, 10))
    low_rank = sum((a + b) * 4 + 4 for a, b in kernels)  # float32 P and Q, and the marker
    dense = sum(a * b * 4 + 4 for a, b in kernels)  # float32 M, and the marker
    biases = (64 + 48 + 10) * 4
    got = summary(comp)
    check(got["tensors"] == 6, f"keras fit: {got['tensors']} tensors counted")
    check(got["total_sent_bytes"] == 6 * low_rank + 2 * dense + 8 * biases, f"keras fit: sent bytes {got}")
    ok("Keras model.fit with horovod.tensorflow.keras.DistributedOptimizer; bytes are P, Q and marker")


check_rank_one_sums_are_exact()
check_full_rank_steps_match_numpy()
check_tape()
check_keras_fit()
ok(f"powersgd checks passed on {SIZE} ranks")
