"""train.py's options and errors: one clear line, no traceback, before any launch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HOROVODRUN, launch_env
from harness.progress import epoch_records, time_to_accuracy

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

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
    (["--compressor-option", "ratio"], "expected KEY=VALUE"),
    (["--max-steps", "0"], "argument --max-steps: must be > 0"),
    (["--stop-at-acc", "1.5"], "argument --stop-at-acc: must be in (0, 1]"),
    (["--stop-at-acc", "0"], "argument --stop-at-acc: must be in (0, 1]"),
    (["--max-train-s", "-2"], "argument --max-train-s: must be > 0"),
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


def records_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("rule, steps", [(["--max-steps", "30"], [22, 30]), (["--max-train-s", "0.001"], [22])])
def test_a_stop_rule_ends_the_run_at_an_evaluation_and_says_which(tmp_path, rule, steps):
    log = tmp_path / "run.jsonl"
    done = run("--model", "mlp", "--dataset", "digits", "--eval-every", "0.5", "--jsonl", str(log), *rule)
    assert done.returncode == 0, done.stderr[-3000:]
    records = records_of(log)
    # 44 steps an epoch: --max-steps 30 adds an evaluation within the epoch and ends there; no
    # --epochs given, so it trains as many as the steps need (one).
    assert [r["step"] for r in records] == steps and not records[-1]["epoch_end"]
    assert [r.get("stopped") for r in records] == [None] * (len(steps) - 1) + [rule[0][2:].replace("-", "_")]
    assert f"train.py: stopped at step {steps[-1]} (" in done.stdout
    first = {r["first_step_s"] for r in records}
    assert len(first) == 1 and 0 < first.pop() < records[0]["train_s"]


def test_stop_at_acc_ends_every_rank_at_rank_0s_evaluation(tmp_path):
    """Two ranks under horovodrun: rank 0 alone evaluates, and both end after its first evaluation."""
    log = tmp_path / "run.jsonl"
    cmd = [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(TRAIN), "--model", "mlp",
           "--dataset", "digits", "--compressor", "topk", "--epochs", "3", "--eval-every", "0.25",
           "--stop-at-acc", "0.01", "--jsonl", str(log)]
    env = {**launch_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    digests = {line.rsplit(" ", 1)[-1] for line in done.stdout.splitlines() if "weights sha256" in line}
    assert "rank 0 weights sha256" in done.stdout and "rank 1 weights sha256" in done.stdout
    assert len(digests) == 1, "both ranks stop at the same step with the same weights"
    records = records_of(log)
    # 1,437 digits over 2 ranks at batch 32: 22 steps an epoch, the first evaluation after step 6.
    assert len(records) == 1 and records[0]["step"] == 6 and records[0]["stopped"] == "stop_at_acc"
