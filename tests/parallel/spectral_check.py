"""GradPart's spectral key area under horovodrun: exact low rank, conservation, identical ranks.

Expectations are computed here in numpy from every rank's input, gathered with plain
``hvd.allgather``; inputs depend on the rank.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, gather_np, init, ok
from small_model import fit_keras, train_tape
from hvd_gradpart import GradPartCompressor, summary
from hvd_gradpart.compressors.research import GradPartResearch

RANK, SIZE = init()
FAN_IN, OUT, RANK_OF_INPUT = 96, 40, 2
SPECTRAL = GradPartResearch(spectral=True)
REDUCTIONS = [  # Horovod's allreduce options, and the factor they put on the sum over ranks
    ("average", dict(op=hvd.Average), 1.0 / SIZE),
    ("sum", dict(op=hvd.Sum), 1.0),
    ("pre/postscale", dict(op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), 1.5),
]


def close(got, want, what, rtol=1e-5):
    scale = np.abs(want).max()
    check(np.allclose(got, want, rtol=rtol, atol=rtol * scale), f"{what}: off by {np.abs(got - want).max():.3g}")


def parts(comp):
    slot = next(iter(comp.memory.slots.values()))
    return slot, comp.keys[slot.key]


def check_low_rank_is_exact_after_warm_up():
    # Every rank's M^T is A_rank V^T, the same each step, with one shared V of rank 2: once the
    # key area is two directions wide (it starts at one and grows while its directions pay) and
    # its Q warm, the factors deliver every rank's input whole, so the output is the exact sum and
    # every residual is empty (the key area alone: no outliers, no density floor).
    v = np.random.RandomState(7).randn(OUT, RANK_OF_INPUT)
    key_only = GradPartResearch(spectral=True, outliers=False, density_floor=0.0)
    for name, kwargs, factor in REDUCTIONS:
        comp = GradPartCompressor(follow_link=False, research=key_only)
        run = tf.function(lambda t: hvd.allreduce(t, compression=comp, **kwargs))
        x = (np.random.RandomState(100 + RANK).randn(FAN_IN, RANK_OF_INPUT) @ v.T).astype(np.float32)
        for _ in range(6):
            got = run(tf.constant(x)).numpy()
        slot, key = parts(comp)
        close(got, factor * gather_np(x).astype(np.float64).sum(0), f"{name}: the rank-2 sum after warm-up", 1e-4)
        residual = slot.residual.numpy()
        check(np.abs(residual).max() <= 1e-4 * np.abs(x).max(), f"{name}: residual {np.abs(residual).max():.3g} left")
        check(slot.metrics.read()["rank"] >= RANK_OF_INPUT, f"{name}: width {slot.metrics.read()['rank']}")
        assert_same_on_all_ranks([got, key.q.numpy(), np.atleast_1d(key.width.numpy())], f"{name} output, Q, width")
    ok("a rank-2 input is delivered exactly after warm-up (average, sum, pre/postscale); ranks identical")


def check_output_plus_residual_is_input():
    # Full-rank inputs: what every rank's outputs delivered plus every rank's residual is the sum
    # of every input handed in, step after step.
    comp = GradPartCompressor(follow_link=False, research=SPECTRAL)
    run = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=hvd.Sum))
    rs = np.random.RandomState(1000 + RANK)
    handed, delivered, widths = np.zeros((FAN_IN, OUT)), np.zeros((FAN_IN, OUT)), []
    low = rs.randn(FAN_IN, 3) @ rs.randn(3, OUT)
    for step in range(12):
        x = (low + 0.1 * rs.randn(FAN_IN, OUT)).astype(np.float32)
        out = run(tf.constant(x)).numpy()
        assert_same_on_all_ranks([out], f"step {step} output")
        handed += gather_np(x).astype(np.float64).sum(0)
        delivered += out
        widths.append(int(parts(comp)[0].metrics.read()["rank"]))
    slot, key = parts(comp)
    residuals = gather_np(slot.residual.numpy().reshape(FAN_IN, OUT)).astype(np.float64).sum(0)
    close(delivered + residuals, handed, "delivered + residuals against handed in", rtol=1e-5)
    check(max(widths) >= 1, "the key area never sent a direction")
    ok(f"output + residual == input over 12 steps (widths {widths}); outputs identical")


STEPS = 6


def check_tape():
    comp = GradPartCompressor(min_elements=0, research=SPECTRAL)
    per_tensor = train_tape(comp, STEPS)
    assert_same_on_all_ranks(per_tensor, "DistributedGradientTape per tensor")
    check(len(comp.keys) == 3, f"{len(comp.keys)} key areas for three kernels")
    grouped = train_tape(GradPartCompressor(min_elements=0, research=SPECTRAL), STEPS, num_groups=1)
    assert_same_on_all_ranks(grouped, "DistributedGradientTape groups=1")
    check(all(np.array_equal(a, b) for a, b in zip(per_tensor, grouped)), "groups=1 differs from per tensor")
    coordinates = train_tape(GradPartCompressor(min_elements=0), STEPS)
    check(not np.array_equal(per_tensor[0], coordinates[0]), "the key area changed nothing")
    key_only_research = GradPartResearch(spectral=True, outliers=False)
    for groups in (0, 1):
        key_only = train_tape(GradPartCompressor(min_elements=0, research=key_only_research), STEPS, groups)
        assert_same_on_all_ranks(key_only, f"the key area alone, groups={groups}")
        check(not np.array_equal(per_tensor[0], key_only[0]), "the key area alone sends what the outliers do")
    ok("DistributedGradientTape in tf.function, per tensor and groups=1 bit-identical; the key area alone too")


def check_keras_fit():
    comp = GradPartCompressor(min_elements=0, research=SPECTRAL)
    assert_same_on_all_ranks(fit_keras(comp, STEPS), "keras fit")
    ranks = {key: slot.metrics.read().get("rank") for key, slot in comp.memory.slots.items()}
    check(sorted(r for r in ranks.values() if r is not None) and all(
        r is None or r >= 0 for r in ranks.values()), f"keras fit: widths {ranks}")
    check(summary(comp)["total_sent_bytes"] > 0, "keras fit: nothing counted")
    ok(f"Keras model.fit with horovod.tensorflow.keras.DistributedOptimizer; widths {sorted(ranks.values(), key=str)}")


check_low_rank_is_exact_after_warm_up()
check_output_plus_residual_is_input()
check_tape()
check_keras_fit()
ok(f"spectral checks passed on {SIZE} ranks")
