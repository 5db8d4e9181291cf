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


def test_top_coordinates_keeps_the_k_largest():
    m = np.array([[0.1, -3.0, 0.2], [2.0, -0.5, 1.0]])
    assert np.array_equal(se.top_coordinates(m, 2), [[0, -3.0, 0], [2.0, 0, 0]])
    assert np.array_equal(se.top_coordinates(m, 9), m)


def test_exact_rank_is_the_truncated_svd(monkeypatch):
    rng = np.random.default_rng(3)
    m = rng.normal(size=(40, 60)) * np.linspace(2, 0.1, 60)
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    for direct in (se.DIRECT, 0):  # a full SVD, then subspace iteration
        monkeypatch.setattr(se, "DIRECT", direct)
        for r in (1, 4):
            sent, v = se.exact_rank(m, rng.normal(size=(60, r + se.OVERSAMPLE)), r)
            assert np.allclose(sent, (u[:, :r] * s[:r]) @ vt[:r], atol=1e-5)
    assert np.allclose(np.abs(v[:, :4].T @ vt[:4].T), np.eye(4), atol=1e-5)  # the start of the next step


def test_feedback_keeps_output_plus_residual_equal_to_input():
    rng = np.random.default_rng(4)
    m = rng.normal(size=(48, 80))
    memory = se.fresh(*m.shape)
    assert sorted(memory) == sorted((r, x) for r in se.FEEDBACK_RANKS for x in se.METHODS)
    residuals = {key: rng.normal(size=m.shape) for key in memory}
    memory = {key: (residuals[key], state) for key, (_, state) in memory.items()}
    for (r, method), (residual, state) in memory.items():
        acc = m + residual
        sent, _ = se.compress(method, acc, state, r)
        if method != "coordinates":
            assert np.linalg.matrix_rank(sent, tol=1e-4 * np.linalg.norm(sent)) == r
        after, rows = se.feedback(m, {(r, method): (residual, state)})
        assert np.allclose(sent + after[r, method][0], acc, atol=1e-5)
        (row,) = rows
        assert abs(row[method] - se.energy(sent) / se.energy(acc)) < 1e-5
        assert abs(row[f"{method}_residual"] - np.linalg.norm(acc - sent) / np.linalg.norm(m)) < 1e-5


def test_with_feedback_a_fixed_rank_1_gradient_is_captured_once_the_residual_settles():
    rng = np.random.default_rng(5)
    m = np.outer(rng.normal(size=32), rng.normal(size=64))
    memory = se.fresh(*m.shape)
    for _ in range(5):
        memory, rows = se.feedback(m, memory)
    for row in rows:
        for method in ("warm", "warm2", "svd"):
            assert row[method] > 1 - 1e-6 and row[f"{method}_residual"] < 1e-3
        assert row["k"] < m.size and row["coordinates"] < 1  # coordinates at these bytes cannot send it all
