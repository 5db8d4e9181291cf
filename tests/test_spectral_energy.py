"""benchmarks/studies/spectral_energy.py: energy shares, effective rank and byte matching on
constructed matrices whose answers are known exactly."""
import horovod.tensorflow as hvd
import numpy as np

from benchmarks.studies import spectral_energy as se

hvd.init()


def _low_rank_plus_spikes(rng, spikes=5):
    """A rank-1 block and ``spikes`` entries in rows and columns the block leaves empty, smaller
    than its singular value: its exact rank-1 part is the block, the remainder the spikes."""
    a, b = rng.normal(size=64), rng.normal(size=96)
    a[:spikes], b[:spikes] = 0, 0
    m = np.outer(a, b)
    m[np.arange(spikes), np.arange(spikes)] = rng.uniform(1, 2, spikes)
    return m


def test_rank_r_captures_a_rank_r_matrix():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(50, 3)) @ rng.normal(size=(3, 70))
    s = np.linalg.svd(m, compute_uv=False)
    assert abs(se.rank_energy(s, 3) - 1.0) < 1e-6
    assert se.rank_energy(s, 2) < 1.0


def test_top_k_captures_a_k_sparse_matrix():
    m = np.zeros((40, 30))
    m.flat[np.random.default_rng(1).choice(m.size, 7, replace=False)] = np.arange(1, 8) * [-1, 1, -1, 1, -1, 1, -1]
    e = se.top_energy(m)
    assert e[7] / e[-1] == 1.0
    assert e[6] / e[-1] < 1.0


def test_effective_rank_of_k_equal_singular_values_is_k():
    assert abs(se.effective_rank(np.array([2.0] * 5 + [0.0] * 3)) - 5) < 1e-9
    assert abs(se.effective_rank(np.array([1.0])) - 1) < 1e-9


def test_byte_matching():
    assert se.factor_bytes(64, 96, 2) == 4 * (64 + 96) * 2
    assert se.matched_k(se.factor_bytes(64, 96, 2)) == 365  # 1280 bytes / 3.5
    assert se.matched_k(7) == 2


def test_both_splits_the_bytes_and_warm_from_exact_vectors_is_the_svd():
    m = _low_rank_plus_spikes(np.random.default_rng(2))
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    rows = {b["rank"]: b for b in se.budgets(m, u, s, vt, vt[:8].T)}
    assert sorted(rows) == [1, 2, 4, 8]
    two = rows[2]
    # rank 1 (the block) and 182 coordinates (the 5 spikes) carry everything; neither alone does
    assert abs(two["both"] - 1.0) < 1e-9 and two["both_rank"] == 1
    assert two["svd"] < 1.0 and two["coordinates"] < 1.0
    for b in rows.values():
        assert abs(b["warm"] - b["svd"]) < 1e-5
        assert b["both"] >= max(b["svd"], b["coordinates"])
