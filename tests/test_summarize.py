"""The demo's summary from hand-made train.py records: targets, table, headline and plot."""
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "summarize.py"
spec = importlib.util.spec_from_file_location("summarize", SCRIPT)
summarize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summarize)


def run_log(path, compressor, points, ratio=None, link_mb=100.0, first_step_s=0.0):
    """``points``: (step, train_s, test_acc, epoch_end) per evaluation."""
    comp = {"compression_ratio": ratio} if ratio else None
    with open(path, "w") as f:
        for i, (step, train_s, acc, end) in enumerate(points):
            epoch = step // 10 if end else step / 10
            f.write(json.dumps({"epoch": epoch, "epoch_end": end, "step": step, "train_s": train_s,
                                "first_step_s": first_step_s,
                                "test_acc": acc, "compressor": compressor, "compression": comp,
                                "link_tx_bytes": link_mb * 1e6 * (i + 1) / len(points) / 2,
                                "link_rx_bytes": link_mb * 1e6 * (i + 1) / len(points) / 2}) + "\n")
    return str(path)


@pytest.fixture
def logs(tmp_path):
    # none ends at 0.90: targets 0.855 (95 %) and 0.891 (99 %).
    none = run_log(tmp_path / "none.jsonl", "none", [(5, 10.0, 0.80, False), (10, 20.0, 0.86, True),
                                                     (15, 30.0, 0.895, False), (20, 40.0, 0.90, True)])
    # gradpart's clock: its first step (1 s of tracing) is not time to accuracy
    fast = run_log(tmp_path / "gradpart.jsonl", "gradpart", [(5, 3.0, 0.70, False), (10, 5.0, 0.87, True),
                                                             (15, 7.0, 0.892, False), (20, 9.0, 0.89, True)],
                   ratio=200.0, link_mb=2.0, first_step_s=1.0)
    with open(tmp_path / "gradpart.steps.jsonl", "w") as f:  # steps 2-20 take 0.4 s, one 1.2 s
        for step in range(1, 21):
            f.write(json.dumps({"step": step, "interval_s": 1.0 if step == 1 else 1.2 if step == 7 else 0.4}) + "\n")
    slow = run_log(tmp_path / "topk.jsonl", "topk", [(5, 3.0, 0.60, False), (10, 6.0, 0.80, True),
                                                     (15, 9.0, 0.86, False), (20, 12.0, 0.88, True)],
                   ratio=50.0, link_mb=5.0)
    return tmp_path, [none, fast, slow]


def test_table_headline_and_plot(logs, capsys):
    folder, paths = logs
    summarize.main(["--title", "t", "--plot", str(folder / "p.png"), "--markdown", str(folder / "s.md"), *paths])
    text = capsys.readouterr().out
    assert (folder / "s.md").read_text() == text
    assert (folder / "p.png").stat().st_size > 10_000
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert lines["method"][:2] == ["to 95% (0.855)", "to 99% (0.891)"]
    assert lines["none"][:2] == ["20.0 s, 10 steps", "30.0 s, 15 steps"]
    assert lines["gradpart"] == ["4.0 s, 10 steps", "6.0 s, 15 steps", "1.0 s", "0.890", "8.0", "200x", "2.0",
                                 "3.0x median"]
    assert lines["none"][2:] == ["0.0 s", "0.900", "40.0", "1x", "100.0", "-"]
    assert lines["topk"][:2] == ["9.0 s, 15 steps", "not reached"]
    assert "gradpart vs none: 99% in 6.0 s vs 30.0 s (speed-up 5.00x), 95% in 4.0 s vs 20.0 s " \
           "(speed-up 5.00x); final accuracy 0.890 after 2 epochs, 50x fewer link bytes." in text
    assert "topk vs none: 99% not reached, 95% in 9.0 s vs 20.0 s (speed-up 2.22x); final accuracy 0.880 " \
           "after 2 epochs, 20x fewer link bytes." in text


def test_runs_are_named_after_their_logs_so_one_compressor_can_run_twice(logs, capsys):
    folder, paths = logs
    twin = run_log(folder / "gradpart-warmup.jsonl", "gradpart", [(5, 1.0, 0.86, False), (10, 2.0, 0.88, True)],
                   ratio=80.0, link_mb=4.0)
    summarize.main([paths[0], paths[1], twin])
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[2:] == ["none", "gradpart", "gradpart-warmup"]


def test_an_empty_log_is_refused_with_the_reason(logs, capsys):
    folder, paths = logs
    (folder / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit):
        summarize.main([*paths, str(folder / "empty.jsonl")])
    assert "no records in" in capsys.readouterr().err
