"""A short soak (scripts/soak.py) on two local ranks: nothing grows once warmed up.

The full run (thousands of steps) is documented in docs/reliability.md.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HOROVODRUN, launch_env

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

SOAK = Path(__file__).parents[1] / "scripts" / "soak.py"
RSS_BOUND_MB = 64


def test_short_soak_has_no_leak(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(SOAK),
         "--steps", "160", "--every", "40", "--warmup", "80", "--retrace-every", "30", "--out", str(out)],
        capture_output=True, text=True, timeout=400, env=launch_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(out.read_text())
    samples = result["samples"]
    assert [s["step"] for s in samples] == list(range(40, 161, 40))
    assert all(s["slots"] == [3, 3] for s in samples), "residual slots appeared after the first step"
    assert result["tf_variables_growth"] == 0 and result["slots_growth"] == 0, result
    assert result["traces_growth"] == 0, "the step kept retracing after warm-up"
    assert result["rss_mb_growth"] < RSS_BOUND_MB, samples
