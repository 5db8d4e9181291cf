"""train.py's errors: one clear line, no traceback, before any launch."""
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = Path(__file__).parents[1] / "scripts" / "train.py"


def run(*args):
    return subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--epochs", "0"], "must be > 0"),
    (["--model", "vgg"], "invalid choice: 'vgg'"),
    (["--compressor", "zip"], "invalid choice: 'zip'"),
    (["--compressor-option", "ratio"], "expected key=value"),
])
def test_bad_arguments_exit_2_with_one_error_line(args, says):
    done = run(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert says in done.stderr.strip().splitlines()[-1]


def test_missing_data_file_names_the_path(tmp_path):
    done = run("--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(lines) == 1 and "nowhere" in lines[0] and "idx" in lines[0].lower()


def test_bad_compressor_option_is_reported_as_such():
    done = run("--compressor", "topk", "--compressor-option", "ratio=5")
    assert done.returncode == 1
    assert "ratio must be in (0, 1]" in done.stderr and "Traceback" not in done.stderr
