"""Exactness of the sparse exchange under horovodrun (any rank count).

Every expectation is computed here from the dense inputs of all ranks,
gathered with plain ``hvd.allgather``, independently of the exchange.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import NothingAnywhere, NothingOnRank1, check, gather_np, init, ok
from hvd_gradpart import TopKCompressor

RANK, SIZE = init()
N = 4096


def topk_np(x, k):
    """Dense array holding x's k largest-magnitude entries, zero elsewhere."""
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out[idx] = x[idx]
    return out


def rank_input(seed=0, n=N, dtype=np.float32):
    return np.random.RandomState(1000 * seed + RANK).randn(n).astype(dtype)


def expected_sum(x, k):
    every = gather_np(x)
    total = np.zeros_like(x)
    for r in range(SIZE):
        total += topk_np(every[r], k)
    return total


def check_reductions():
    x = rank_input(1)
    k = 41
    want = expected_sum(x, k)
    cases = [
        ("average", dict(op=hvd.Average), want / SIZE),
        ("sum", dict(op=hvd.Sum), want),
        ("pre/postscale", dict(op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0), want * 1.5),
        ("average+postscale", dict(op=hvd.Average, postscale_factor=2.0), want * 2.0 / SIZE),
    ]
    for mode in ("eager", "function"):
        for name, kwargs, expected in cases:
            comp = TopKCompressor(ratio=0.01)
            run = lambda t: hvd.allreduce(t, compression=comp, **kwargs)
            got = (tf.function(run) if mode == "function" else run)(tf.constant(x)).numpy()
            check(np.allclose(got, expected, rtol=1e-6, atol=1e-7), f"{mode} {name}: wrong result")
            residual = next(iter(comp.memory.slots.values())).residual.numpy()
            check(np.array_equal(residual, x - topk_np(x, k)), f"{mode} {name}: residual wrong")
    ok("reductions match the exact sparse average/sum")


def check_empty_selection():
    x = rank_input(2)
    every = gather_np(x)
    want = sum(topk_np(every[r], 41) for r in range(SIZE) if r != 1)
    comp = NothingOnRank1(ratio=0.01)
    got = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=hvd.Sum))(x)
    check(np.allclose(got.numpy(), want, rtol=1e-6), "one rank selecting nothing: wrong sum")
    got = hvd.allreduce(tf.constant(x), compression=NothingAnywhere(), op=hvd.Sum)
    check(np.array_equal(got.numpy(), np.zeros(N, np.float32)), "nobody selecting: not zero")
    ok("a rank selecting nothing finishes")


def check_grouped_and_small():
    comp = TopKCompressor(ratio=1.0, min_elements=0)
    scalar = tf.constant(3.0 * (RANK + 1))
    one = tf.constant([float(RANK + 1)])
    small = tf.constant(np.arange(10, dtype=np.float32) * (RANK + 1))
    outs = tf.function(lambda a, b, c: hvd.grouped_allreduce([a, b, c], compression=comp, op=hvd.Sum))(
        scalar, one, small)
    tri = SIZE * (SIZE + 1) / 2
    check(outs[0].shape == () and outs[0].numpy() == 3.0 * tri, "scalar sum wrong")
    check(outs[1].shape == (1,) and outs[1].numpy()[0] == tri, "1-element sum wrong")
    check(np.array_equal(outs[2].numpy(), np.arange(10) * tri), "grouped small sum wrong")
    check(len(comp.memory.slots) == 3, f"expected 3 slots, got {list(comp.memory.slots)}")
    ok("scalars, 1-element tensors and grouped allreduce")


def check_dtypes_and_fp16_encoding():
    for dtype in (np.float16, np.float64, tf.bfloat16.as_numpy_dtype):
        x = rank_input(3, dtype=np.float32).astype(dtype)
        got = hvd.allreduce(tf.constant(x), compression=TopKCompressor(ratio=1.0), op=hvd.Sum)
        want = gather_np(x.astype(np.float32)).sum(0)
        check(got.dtype == tf.as_dtype(dtype), f"{dtype}: dtype changed to {got.dtype}")
        check(np.allclose(got.numpy().astype(np.float32), want, rtol=1e-2), f"{dtype}: wrong sum")
    x = rank_input(4)
    comp = TopKCompressor(ratio=0.05, value_encoding="fp16")
    got = hvd.allreduce(tf.constant(x), compression=comp, op=hvd.Sum).numpy()
    k = int(np.ceil(0.05 * N))
    every = gather_np(x)
    want = sum(topk_np(every[r], k).astype(np.float16).astype(np.float32) for r in range(SIZE))
    check(np.allclose(got, want, rtol=1e-6), "fp16 encoding: wrong sum")
    residual = next(iter(comp.memory.slots.values())).residual.numpy()
    sent = topk_np(x, k).astype(np.float16).astype(np.float32)
    check(np.array_equal(residual, x - sent), "fp16 encoding: rounding error not kept in residual")
    ok("float16/bfloat16/float64 gradients and fp16 value encoding")


def check_mass_conservation():
    comp = TopKCompressor(ratio=0.01)
    step = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=hvd.Sum))
    sent_total = np.zeros(N, np.float64)
    grad_total = np.zeros(N, np.float64)
    for t in range(6):
        g = np.random.RandomState(77 * t + RANK).randint(-8, 9, N).astype(np.float32)
        sent_total += step(tf.constant(g)).numpy()
        grad_total += gather_np(g).sum(0)
    residual = next(iter(comp.memory.slots.values())).residual.numpy()
    residuals = gather_np(residual).sum(0)
    check(np.array_equal(sent_total + residuals, grad_total), "sent + residual != sum of gradients")
    check(len(comp.memory.slots) == 1, "one gradient, several slots")
    ok("mass conservation is exact: sent + residual == sum of gradients")


check_reductions()
check_empty_selection()
check_grouped_and_small()
check_dtypes_and_fp16_encoding()
check_mass_conservation()
ok(f"exchange checks passed on {SIZE} ranks")
