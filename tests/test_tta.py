"""The time-to-accuracy matrix without a cluster: its plan, its resumption and its reduction."""
import json
import math

import pytest

from benchmarks import tta
from benchmarks import tta_plan as tp
from benchmarks.report import build as report, tta_table
from hvd_gradpart import COMPRESSORS


def rec(step, clock, acc, first=2.0, link_mb=0.0, ratio=None, stopped=None):
    """One train.py record: ``clock`` seconds of training after a ``first``-second first step."""
    r = {"step": step, "epoch": step / 62, "epoch_end": step % 62 == 0, "train_s": clock + first,
         "first_step_s": first, "test_acc": acc, "link_tx_bytes": link_mb * 5e5, "link_rx_bytes": link_mb * 5e5,
         "compression": {"compression_ratio": ratio} if ratio else None}
    return {**r, "stopped": stopped} if stopped else r


def none_run(final):
    return [rec(10, 10.0, 0.5, link_mb=10), rec(20, 20.0, 0.86, link_mb=20),
            rec(30, 30.0, final, link_mb=30, stopped="max_steps")]


def write(results, model, link, method, seed, records, compressor=None, status="done", options=()):
    run = tp.Run(model, link, seed, tp.Method(method, compressor or method, tuple(options)), 186)
    path = run.path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    if records is not None:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    tp.append_index(results, {"model": model, "link": link, "method": method, "seed": seed,
                              "compressor": compressor or method, "options": list(options), "status": status,
                              "file": str(path.relative_to(results))})


def plan_lines(capsys, *args):
    assert tta.main(["--dry-run", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    return [line.split(" ", 6) for line in out if not line.startswith("tta:")], out[-1]


def test_dry_run_plans_link_by_link_none_first_every_registered_method_and_the_grid(tmp_path, capsys):
    lines, summary = plan_lines(capsys, "--models", "mlp", "lenet5", "--links", "100mbit", "20mbit",
                                "--results", str(tmp_path))
    methods = ["none", *sorted(n for n in COMPRESSORS if n not in ("none", "gradpart")), "gradpart",
               "topk-0.03%", "topk-0.1%", "topk-0.3%", "topk-3%", "topk-10%"]  # topk (1 %, its default) is the grid's 1 %
    assert len(lines) == 2 * 2 * 3 * len(methods)
    expected = [(link, model, f"seed{s}", m) for link in ("100mbit", "20mbit") for model in ("mlp", "lenet5")
                for s in (0, 1, 2) for m in methods]
    assert [(ln[2], ln[1], ln[3], ln[4]) for ln in lines] == expected
    for state, model, link, seed, method, spec, detail in lines:
        if method == "none":
            budget = {"mlp": 186, "lenet5": 310}[model]
            assert (state, spec, detail) == ("run", "[none]", f"--max-steps {budget}")
        else:
            assert state == "wait" and f"--max-steps {4 * {'mlp': 186, 'lenet5': 310}[model]}" in detail
    assert ["[topk,ratio=0.003]"] == [ln[5] for ln in lines[:len(methods)] if ln[4] == "topk-0.3%"]
    assert summary.startswith(f"tta: {len(expected)} runs: 0 done, 12 to run now, {len(expected) - 12} after")


def test_defaults_cover_the_whole_matrix(tmp_path, capsys):
    lines, _ = plan_lines(capsys, "--results", str(tmp_path))
    assert {ln[2] for ln in lines} == {"10gbit", "100mbit", "20mbit", "10mbit"}
    assert {ln[1] for ln in lines} == {"mlp", "lenet5", "resnet20", "mobilenetv2"}
    assert len(lines) == 4 * 4 * 3 * (len(COMPRESSORS) + 5)


@pytest.mark.parametrize("args, says", [
    (["--methods", "zipper"], "method 'zipper' is not registered in hvd_gradpart.COMPRESSORS"),
    (["--methods", "x=zip,ratio=1"], "compressor 'zip' is not registered"),
    (["--links", "100"], "link '100': expected a rate such as 100mbit"),
    (["--models", "vgg"], "model 'vgg' has no step budget"),
    (["--seeds", "-1"], "seeds must be >= 0"),
    (["--budget", "0"], "the budget >= 1 step"),
    (["--local", "--links", "20mbit"], "--local runs on no shaped link"),
])
def test_bad_plans_exit_2_with_one_clear_line(args, says, capsys):
    with pytest.raises(SystemExit) as stop:
        tta.main(["--dry-run", *args])
    assert stop.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]


def test_configured_methods_and_a_named_grid_point(tmp_path, capsys):
    lines, _ = plan_lines(capsys, "--local", "--models", "mlp", "--seeds", "0", "--budget", "20", "--methods",
                          "gradpart-warmup=gradpart,warmup_steps=400", "topk-10%", "--results", str(tmp_path))
    assert [(ln[2], ln[4], ln[5]) for ln in lines] == [
        ("localhost", "none", "[none]"), ("localhost", "gradpart-warmup", "[gradpart,warmup_steps=400]"),
        ("localhost", "topk-10%", "[topk,ratio=0.1]")]
    assert lines[0][6] == "--max-steps 20" and "--max-steps 80" in lines[1][6]


def test_resume_skips_finished_runs_and_sets_limits_from_none_of_the_same_seed(tmp_path, capsys, monkeypatch):
    write(tmp_path, "mlp", "100mbit", "none", 0, none_run(0.90))
    write(tmp_path, "mlp", "100mbit", "topk", 0, [rec(40, 5.0, 0.9, stopped="stop_at_acc")])
    write(tmp_path, "mlp", "100mbit", "gradpart", 0, None, status="failed")
    write(tmp_path, "mlp", "100mbit", "none", 1, None)  # listed done, file gone: rerun
    common = ["--models", "mlp", "--seeds", "0", "1", "--methods", "topk", "gradpart", "--results", str(tmp_path)]
    lines, summary = plan_lines(capsys, "--links", "100mbit", *common)
    states = {(ln[3], ln[4]): (ln[0], ln[6]) for ln in lines}
    assert states[("seed0", "none")] == ("done", "mlp/100mbit/none-seed0.jsonl")
    assert states[("seed0", "topk")][0] == "done"
    # none of seed 0 ended at 0.90 after 30 s past its first step: 99 % is 0.891, twice its clock 60 s.
    assert states[("seed0", "gradpart")] == ("run", f"--max-steps 744 --stop-at-acc {0.99 * 0.90!r} "
                                                    "--max-train-s 60.0")
    assert [states[("seed1", m)][0] for m in ("none", "topk", "gradpart")] == ["run", "wait", "wait"]
    assert summary.startswith("tta: 6 runs: 2 done, 2 to run now, 2 after")

    launched = []

    def fake_launch(run, stops, results, hosts):
        launched.append((run.seed, run.method.name, stops))
        final = 0.5 if run.method.name == "none" else 0.99
        run.path(results).parent.mkdir(parents=True, exist_ok=True)
        run.path(results).write_text("".join(json.dumps(r) + "\n" for r in none_run(final)))
        return 0
    monkeypatch.setattr(tta, "launch", fake_launch)
    assert tta.main(["--local", *common]) == 0  # the same runs on the link label localhost
    assert [(s, m) for s, m, _ in launched] == [(s, m) for s in (0, 1) for m in ("none", "topk", "gradpart")]
    launched.clear()
    assert tta.main(["--local", *common]) == 0
    assert launched == []  # everything done: a rerun launches nothing
    tta.execute(tta.parse_args(["--links", "100mbit", *common]).runs, tmp_path, tta.Cluster(local=True), [])
    assert [(s, m) for s, m, _ in launched] == [(0, "gradpart"), (1, "none"), (1, "topk"), (1, "gradpart")]
    assert launched[1][2] == ["--max-steps", "186"]
    assert launched[2][2][:4] == ["--max-steps", "744", "--stop-at-acc", repr(0.99 * 0.5)]
    index = tp.read_index(tmp_path)
    assert index[("mlp", "100mbit", "gradpart", 1)]["status"] == "done"
    assert index[("mlp", "100mbit", "topk", 1)]["stops"] == launched[2][2]


def test_a_failed_launch_is_listed_and_retried(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tta, "launch", lambda *a: 3)
    args = ["--local", "--models", "lenet5", "--seeds", "0", "--methods", "topk", "--results", str(tmp_path)]
    assert tta.main(args) == 1
    out = capsys.readouterr().out
    assert "FAILED (exit 3)" in out and "skipped topk: no compression's run of lenet5 localhost seed 0" in out
    assert tp.read_index(tmp_path)[("lenet5", "localhost", "none", 0)]["status"] == "failed"
    assert "tta: 2 runs: 0 done, 1 to run now, 1 after" in out


def cell():
    """mlp at 100mbit, 3 seeds; no compression ends at 0.90, 0.80 and 0.70 (99 %: 0.891, 0.792, 0.693)."""
    runs = {"none": {s: none_run(f) for s, f in enumerate((0.90, 0.80, 0.70))}}
    gradpart = [rec(40, 5.0, 0.78, link_mb=1, ratio=200.0), rec(80, 10.0, 0.895, link_mb=2, ratio=300.0,
                                                                  stopped="stop_at_acc")]
    runs["gradpart"] = {s: gradpart for s in range(3)}
    runs["topk"] = {s: [rec(40, 8.0, 0.6, ratio=50.0), rec(80, 16.0, 0.65, link_mb=7, ratio=50.0,
                                                            stopped="max_train_s")] for s in range(3)}
    runs["topk-3%"] = {s: [rec(40, 3.0, 0.7, ratio=17.0), rec(80, 6.0, 0.95, ratio=17.0, stopped="stop_at_acc")]
                       for s in range(3)}
    runs["variance"] = {s: [rec(40, 3.0, 0.70, first=1.0, ratio=5.0, stopped="max_steps")] for s in range(3)}
    return runs


def write_cell(results, runs):
    for method, by_seed in runs.items():
        for seed, records in by_seed.items():
            write(results, "mlp", "100mbit", method, seed, records, "topk" if method == "topk-3%" else method)


def test_reduction_medians_ranges_targets_of_the_same_seed_and_best_of_grid(tmp_path):
    write_cell(tmp_path, cell())
    cells = tta_table.load(tmp_path)
    rows = {r["method"]: r for r in tta_table.rows(cells[("mlp", "100mbit")])}
    order = [r["method"] for r in tta_table.rows(cells[("mlp", "100mbit")])]
    assert order == ["none", "best Top-k: topk-3%", "topk-3%", "gradpart", "topk", "variance"]
    # Each seed against its own none: gradpart's 0.78 passes seed 1's 95 % (0.76) and seed 2's 99 % (0.693).
    assert rows["gradpart"]["s95"] == (5.0, 5.0, 10.0) and rows["gradpart"]["s99"] == (10.0, 5.0, 10.0)
    assert rows["gradpart"]["steps99"] == (80, 40, 80) and rows["gradpart"]["reached99"] == 3
    assert rows["gradpart"]["link_MB"] == (2.0, 1.0, 2.0)  # until the evaluation that reached 99 %
    assert rows["gradpart"]["ratio"] == (300.0, 300.0, 300.0)
    assert rows["gradpart"]["first_step_s"] == (2.0, 2.0, 2.0)
    assert rows["none"]["s99"] == (20.0, 20.0, 30.0) and rows["none"]["ratio"] is None
    assert rows["topk"]["s99"] == (math.inf, math.inf, math.inf) and rows["topk"]["link_MB"] == (7.0, 7.0, 7.0)
    # variance reaches 99 % on seed 2 only: its median is not reached.
    assert rows["variance"]["s99"] == (math.inf, 3.0, math.inf) and rows["variance"]["reached99"] == 1
    assert rows["variance"]["first_step_s"] == (1.0, 1.0, 1.0) and rows["variance"]["final_acc"] == (0.7, 0.7, 0.7)
    best = rows["best Top-k: topk-3%"]
    assert best["best"] and best["s99"] == rows["topk-3%"]["s99"] == (6.0, 3.0, 6.0)

    table = tta_table.markdown(tta_table.rows(cells[("mlp", "100mbit")])).splitlines()
    assert table[2].startswith("| none | 20.0 | 20 | 20.0 (20.0–30.0) | 20 (20–30) | 3/3 | 1.0x | ")
    assert table[3].startswith("| **best Top-k: topk-3%** | 6.0 (3.0–6.0) | 80 (40–80) | 6.0 (3.0–6.0) |")
    assert table[4].split(" | ")[5:7] == ["3/3", "3.3x"]
    assert table[5] == ("| gradpart | 5.0 (5.0–10.0) | 40 (40–80) | 10.0 (5.0–10.0) | 80 (40–80) | 3/3 | "
                        "2.0x | 0.895 | 300x | 2.0 (1.0–2.0) | 2.0 | – |")  # no step log: no slowest step
    assert table[7].startswith("| variance | n.r. (3.0–n.r.) | n.r. (40–n.r.) | n.r. (3.0–n.r.) |")
    assert "| 1/3 | – |" in table[7]
    head = tta_table.headline(cells).splitlines()
    assert head[2] == ("| mlp | 100mbit | 3 | 20.0 s | topk n.r. (–) | topk-3% 6.0 s (3.3x) | "
                       "**10.0 s (2.0x)** |")
    assert set(tta_table.median_runs(cells[("mlp", "100mbit")])) == {"none", "topk-3%", "gradpart", "topk",
                                                                     "variance"}
    assert tta_table.median_targets(cells[("mlp", "100mbit")]) == {0.95: pytest.approx(0.76),
                                                                    0.99: pytest.approx(0.792)}


def test_a_method_without_none_of_its_seed_is_left_out(tmp_path):
    runs = cell()
    del runs["none"][2]
    write_cell(tmp_path, runs)
    rows = tta_table.rows(tta_table.load(tmp_path)[("mlp", "100mbit")])
    assert {r["seeds"] for r in rows} == {2}
    assert len([r for r in tta_table.csv_rows(tta_table.load(tmp_path))]) == 5 * 2


def test_report_fills_the_tta_blocks_and_plots_each_model(tmp_path):
    write_cell(tmp_path / "tta", cell())
    docs = tmp_path / "results.md"
    docs.write_text("<!-- generated:tta -->\n<!-- /generated:tta -->\n"
                    "<!-- generated:tta-headline -->\nold\n<!-- /generated:tta-headline -->\n")
    report.main(["--results", str(tmp_path), "--docs", str(docs)])
    text = docs.read_text()
    assert "**mlp, 100mbit**: 3 seed(s); no compression trained 30 steps to a final accuracy of 0.800" in text
    assert "| **best Top-k: topk-3%** |" in text and "old" not in text
    assert "| mlp | 100mbit | 3 | 20.0 s |" in text
    assert (tmp_path / "plots" / "tta-mlp.png").stat().st_size > 10_000
    assert (tmp_path / "tta.csv").read_text().count("\n") == 1 + 5 * 3


def test_picks_rank_methods_by_their_geometric_mean_over_the_fastest_of_each_model(tmp_path):
    runs = cell()
    write_cell(tmp_path, runs)
    swapped = {**runs, "gradpart": runs["topk-3%"], "topk-3%": runs["gradpart"]}  # lenet5: gradpart first
    for method, by_seed in swapped.items():
        for seed, records in by_seed.items():
            write(tmp_path, "lenet5", "100mbit", method, seed, records, "topk" if method == "topk-3%" else method)
    lines = tta_table.picks(tta_table.load(tmp_path)).splitlines()
    # 6 s against 10 s on each model, the other way round: both sqrt(10 / 6) = 1.29x; none 20 / 6 on both.
    assert lines[2] == ("| 100mbit | mlp, lenet5 | gradpart 1.29x | topk-3% 1.29x, none 3.33x, topk n.r. | "
                        "gradpart 1.29x, 1 of 5 |")
