"""The allocation study's selections (benchmarks.studies.allocation) on hand-made gradients."""
import numpy as np
import pytest

from benchmarks.studies.allocation import GlobalTopK, RuleSelection, table
from hvd_gradpart.compressors.gradpart import GradPartCompressor


def test_global_top_k_takes_the_largest_over_every_tensor_and_keeps_the_rest():
    top = GlobalTopK([3, 4])
    grads = [np.array([5.0, -1.0, 0.5], np.float32), np.array([0.1, -4.0, 3.0, 0.2], np.float32)]
    assert top.step(grads, 3) == [1, 2]  # 5, -4 and 3
    np.testing.assert_array_equal(top.residuals[0], np.array([0.0, -1.0, 0.5], np.float32))
    np.testing.assert_array_equal(top.residuals[1], np.array([0.1, 0.0, 0.0, 0.2], np.float32))
    assert top.step([np.zeros(3, np.float32), np.zeros(4, np.float32)], 1) == [1, 0]  # the residual's -1


@pytest.mark.parametrize("model_wide", [False, True])
def test_the_rule_s_selection_keeps_every_value_it_does_not_send(model_wide):
    rng = np.random.default_rng(0)
    sizes = [2048, 40_000]
    selection = RuleSelection(GradPartCompressor(follow_link=False), sizes, model_wide)
    drift = [rng.laplace(0.0, 1.0, n) for n in sizes]  # a persistent part: residuals grow, the rule sends
    sent_total = 0
    for _ in range(20):
        grads = [(d + rng.laplace(0.0, 0.3, d.size)).astype(np.float32) for d in drift]
        before = [r.copy() for r in selection.residuals]
        sent = selection.step(grads)
        for i, n in enumerate(sizes):
            assert sent[i] <= 0.02 * n  # the ceiling
            changed = selection.residuals[i] != before[i] + grads[i]
            assert int(changed.sum()) == sent[i] and np.all(selection.residuals[i][changed] == 0.0)
        sent_total += sum(sent)
    assert sent_total > 0


def test_the_table_lists_every_size_class_and_the_whole():
    result = {"model": "m", "steps": 30, "settle": 20, "elements": 5000,
              "classes": [{"class": "0-4,096", "tensors": 1, "elements": 2000, "per-tensor": 0.01,
                           "model-wide": 0.005, "global top-k": 0.02}],
              "overall": {"per-tensor": 0.004, "model-wide": 0.002, "global top-k": 0.002}}
    lines = table(result).splitlines()
    assert lines[-2].startswith("| 0-4,096 | 1 | 2,000 | 1.000 % | 0.500 % | 2.000 %")
    assert lines[-1].startswith("| all |  | 5,000 | 0.400 %")
