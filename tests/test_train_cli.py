"""train.py's options and errors: one clear line, no traceback, before any launch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env
from hvd_gradpart.progress import epoch_records, time_to_accuracy

TRAIN = Path(__file__).parents[1] / "scripts" / "train.py"


def run(*args):
    env = {**launch_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_evaluations_cosine_schedule_and_batchnorm_recalibration_in_one_process(tmp_path):
    log = tmp_path / "run.jsonl"
    done = run("--model", "resnet20", "--dataset", "digits", "--epochs", "2", "--lr", "0.01",
               "--lr-schedule", "cosine", "--bn-batches", "5", "--eval-every", "0.5", "--jsonl", str(log))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # 1,437 training digits, batch 32: 44 steps an epoch, evaluated after steps 22 and 44.
    assert [r["epoch"] for r in records] == [0.5, 1, 1.5, 2]
    assert [r["epoch_end"] for r in records] == [False, True, False, True]
    assert [r["eval"] for r in records] == [1, 2, 3, 4]
    assert [r["step"] for r in records] == [22, 44, 66, 88]
    assert [r["samples"] for r in records] == [22 * 32, 44 * 32, 66 * 32, 88 * 32]
    # The training clock leaves out each recalibration and evaluation; the wall clock does not.
    for before, after in zip(records, records[1:]):
        assert 0 < after["train_s"] - before["train_s"] < after["wall_s"] - before["wall_s"]
    first, last = epoch_records(records)
    # Halfway through the run the cosine is at half the rate; at the end, at zero.
    assert abs(first["lr"] - 0.005) < 1e-6 and abs(last["lr"]) < 1e-9
    assert last["test_acc"] > 0.5, "recalibrated BatchNorm statistics should give a working model"
    reached = time_to_accuracy(records, last["test_acc"])
    assert reached is not None and reached.step <= 88 and reached.train_s <= last["train_s"]


@pytest.mark.parametrize("args, says", [
    (["--epochs", "0"], "must be > 0"),
    (["--bn-batches", "-1"], "must be >= 0"),
    (["--eval-every", "0"], "must be in (0, 1]"),
    (["--eval-every", "2"], "must be in (0, 1]"),
    (["--lr-schedule", "step"], "invalid choice: 'step'"),
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


def test_log_in_a_missing_folder_is_refused_before_training(tmp_path):
    done = run("--jsonl", str(tmp_path / "nowhere" / "run.jsonl"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "--jsonl" in done.stderr and "no folder" in done.stderr and "nowhere" in done.stderr


def test_bad_compressor_option_is_reported_as_such():
    done = run("--compressor", "topk", "--compressor-option", "ratio=5")
    assert done.returncode == 1
    assert "ratio must be in (0, 1]" in done.stderr and "Traceback" not in done.stderr
