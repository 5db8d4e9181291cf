"""A group's GradPart gradients in one step (``compressors/batch.py``), in one process: the same
selections, sums and residuals as the per-gradient step, the guards, a non-finite group, the
layout and the accounting. Horovod runs at size 1 (its allgather works there); a traced function
that compresses every gradient, then decompresses each, is Horovod's grouped path; eager calls
take the per-gradient step, the reference."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import exchange, get_compressor, stats, summary
from hvd_gradpart.compressors import batch, topk
from hvd_gradpart.compressors.gradpart import GradPartCompressor, top_each

hvd.init()

SIZES = (2304, 9216, 70000, 1500)  # 70,000: the compiled sweep


def gradients(seed, sizes=SIZES, scale=1e-3):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.laplace(0.0, scale, n).astype(np.float32)) for n in sizes]


def grouped(comp):
    """Compress every gradient, then decompress each, in one traced function (one group)."""
    @tf.function
    def step(grads):
        compressed = [comp.compress(g) for g in grads]
        return [comp.decompress(*c) for c in compressed]

    return step


def slots(comp):
    return list(comp.memory.slots.values())


@pytest.mark.parametrize("ceiling", [0.02, 0.0005])
def test_a_batch_sends_and_keeps_what_the_per_gradient_step_does(ceiling):
    batched = get_compressor("gradpart", follow_link=False, density_ceiling=ceiling)
    alone = get_compressor("gradpart", follow_link=False, density_ceiling=ceiling)
    step = grouped(batched)
    sets = [gradients(seed) for seed in range(4)]
    for i in range(24):  # error feedback piles up: later steps select many and hit the ceiling
        grads = sets[i % 4]
        together = step(grads)
        apart = [alone.decompress(*alone.compress(g)) for g in grads]
        for a, b in zip(together, apart):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    sent = 0
    for a, b in zip(slots(batched), slots(alone)):
        np.testing.assert_array_equal(a.residual.numpy(), b.residual.numpy())
        # the fits, vectorized over the batch, may differ in the last bits (reductions in another order)
        np.testing.assert_allclose(a.state["prediction"].numpy(), b.state["prediction"].numpy(), rtol=1e-12)
        assert a.metrics.read()["sent_elements"] == b.metrics.read()["sent_elements"]
        sent += a.metrics.read()["sent_elements"]
    assert sent > 0
    if ceiling < 0.001:  # the ceiling held for the largest gradient
        assert slots(batched)[2].metrics.read()["sent_elements"] == int(ceiling * 70000)


def test_a_batch_pays_one_header_and_counts_every_byte_it_sends():
    comp = get_compressor("gradpart", follow_link=False)
    step = grouped(comp)
    for seed in range(3):
        step(gradients(seed))
    rows = [s.metrics.read() for s in slots(comp)]
    sent = sum(r["sent_bytes"] for r in rows)
    # the payload: one header, its positions and float16 values; one length, the group's tag, 4 markers
    values = sum(r["sent_elements"] for r in rows)
    assert 9 + 2 * values <= sent - 4 - 4 - 4 * 4 <= 9 + 6 * values
    assert summary(comp)["total_sent_bytes"] == pytest.approx(sum(r["total_sent_bytes"] for r in rows))


def test_a_group_with_a_non_finite_gradient_sends_nan_and_keeps_every_residual():
    comp = get_compressor("gradpart", follow_link=False)
    step = grouped(comp)
    step(gradients(0))
    before = [(s.residual.numpy(), s.state["prediction"].numpy()) for s in slots(comp)]
    grads = gradients(1)
    grads[1] = tf.tensor_scatter_nd_update(grads[1], [[5]], [float("inf")])
    sums = step(grads)
    assert all(not np.isfinite(s.numpy()).all() for s in sums)
    for s, (residual, prediction) in zip(slots(comp), before):
        np.testing.assert_array_equal(s.residual.numpy(), residual)
        np.testing.assert_array_equal(s.state["prediction"].numpy(), prediction)
    assert all(np.isfinite(s.numpy()).all() for s in step(gradients(2)))  # the next step goes on


def test_the_floor_tops_up_a_gradient_the_rule_leaves_empty():
    comp = get_compressor("gradpart", follow_link=False)
    step = grouped(comp)
    grads = gradients(0)
    grads[0] = tf.zeros([SIZES[0]])  # nothing to select: the floor sends its top-1 (a zero)
    step(grads)
    assert slots(comp)[0].metrics.read()["sent_elements"] == 1
    assert all(s.metrics.read()["sent_elements"] >= np.ceil(1e-4 * n) for s, n in zip(slots(comp), SIZES))


def test_the_layout_samples_where_the_per_gradient_fit_does():
    layout = batch.Layout((10, 5000, 3), sample_size=16)
    flat = tf.range(5013)
    samples, valids = layout.sample(flat)
    for i, n in enumerate(layout.sizes):
        sample, valid = stats.fixed_sample(layout.piece(flat, i), 16)
        np.testing.assert_array_equal(valids[i].numpy(), valid.numpy())
        np.testing.assert_array_equal(samples[i].numpy()[valid.numpy()], sample.numpy()[valid.numpy()])
    lone = batch.Layout((777,), sample_size=16)
    assert lone.lone and lone.sizes == (None,) and lone.total(flat).numpy() == 5013
    indices = tf.constant([0, 9, 10, 5009, 5010, 5012])
    np.testing.assert_array_equal(layout.owner(indices).numpy(), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(layout.count(indices).numpy(), [2, 2, 2])
    np.testing.assert_array_equal(layout.owners().numpy(), np.repeat([0, 1, 2], layout.sizes))


def test_top_each_keeps_each_gradients_largest_as_top_among_does():
    layout = batch.Layout((8, 6, 5), sample_size=4)
    x = tf.constant([1, -7, 3, 3, -3, 0.5, 9, 2,   # ties at 3: the lower index goes first
                     4, 4, -4, 1, 1, 1,
                     5, 6, 7, 8, 9], tf.float32)
    indices = tf.constant([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 14, 16], tf.int32)
    high = tf.constant([3, 2, 5])
    got = top_each(x, indices, layout, high).numpy()
    expected = []
    for i, k in enumerate(high.numpy()):
        at = indices.numpy()
        own = at[(at >= layout.offsets[i]) & (at < layout.offsets[i] + layout.sizes[i])]
        candidates = topk.fused.Candidates(tf.constant(own), len(own))
        expected += topk.top_among(x, candidates, min(k, len(own))).numpy().tolist()
    assert got.tolist() == sorted(expected) == [1, 2, 6, 8, 9, 14, 16]


@pytest.mark.parametrize("sizes", [(3000, 500, 4000), (5000,)])
def test_top_each_narrowed_by_buckets_keeps_exactly_the_largest_ties_by_lower_index(sizes):
    rs = np.random.RandomState(len(sizes))
    layout = batch.Layout(sizes, sample_size=64)
    # magnitudes over many octaves, many of them equal, so the boundary bucket holds ties
    x = (rs.choice([-1, 1], sum(sizes)) * np.round(rs.laplace(0, 40, sum(sizes))) / 8).astype(np.float32)
    indices = np.sort(rs.choice(sum(sizes), sum(sizes) // 2, replace=False)).astype(np.int32)
    high = np.array([max(1, n // 50) for n in sizes] if len(sizes) > 1 else [77], np.int32)
    high[len(high) // 2] = 10 ** 6  # a gradient under its ceiling keeps every candidate
    got = top_each(tf.constant(x), tf.constant(indices), layout, tf.constant(high)).numpy()
    expected = []
    for i, offset in enumerate(np.cumsum((0,) + sizes[:-1])):
        own = indices[(indices >= offset) & (indices < offset + sizes[i])]
        by_size = own[np.argsort(-np.abs(x[own]), kind="stable")]  # largest first, ties by lower index
        expected += sorted(by_size[:high[i]].tolist())
    assert got.tolist() == expected


def test_other_dtypes_eager_calls_and_changed_hooks_keep_the_per_gradient_step():
    class Changed(GradPartCompressor):
        def mask(self, acc, grad, state, plan):
            return super().mask(acc, grad, state, plan)

    comp, changed = GradPartCompressor(), Changed()
    assert not comp.batches(tf.zeros([4096]))  # eager
    traced = []

    @tf.function
    def look():
        traced.extend([comp.batches(tf.zeros([4096])), comp.batches(tf.zeros([4096], tf.float16)),
                       changed.batches(tf.zeros([4096]))])
        return tf.zeros([])

    look()
    assert traced == [True, False, False]


def test_a_deferred_payload_is_made_when_its_group_is_gathered():
    made = []

    class Late(exchange.Deferred):
        def payload(self):
            made.append(True)
            return exchange.encode(tf.constant([2.0]), tf.constant([1]), 4, header_digest=7).payload

        def header(self):
            return 7

        def what(self):
            return "late"

    @tf.function
    def run():
        ticket = exchange.enqueue(Late(), None, None)
        assert not made
        return exchange.decode_sum(ticket.payloads(), 4, tf.float32)

    np.testing.assert_array_equal(run().numpy(), [0, 2, 0, 0])
    assert made == [True]


def test_lone_gradients_of_every_size_share_one_traced_step():
    comp = get_compressor("gradpart", follow_link=False)
    before = batch._shared_step.experimental_get_tracing_count()  # noqa: SLF001

    @tf.function
    def per_tensor(grads):  # each decompress gathers its own group: Horovod's path without groups
        return [comp.decompress(*comp.compress(g)) for g in grads]

    alone = get_compressor("gradpart", follow_link=False)
    for seed in range(3):
        grads = gradients(seed, sizes=(2304, 9216, 36864, 70000, 1500))
        for a, g in zip(per_tensor(grads), grads):
            np.testing.assert_array_equal(a.numpy(), alone.decompress(*alone.compress(g)).numpy())
    # the first size traces the step, the second its general shape; no further trace
    assert batch._shared_step.experimental_get_tracing_count() - before <= 2  # noqa: SLF001
