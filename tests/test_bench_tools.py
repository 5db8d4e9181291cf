"""The benchmark report's pure parts: derived figures, tables, targets, scaling model, plots."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from benchmarks import records as br  # noqa: E402
from benchmarks import scaling  # noqa: E402
from benchmarks.report import build as report, table, targets  # noqa: E402


def epoch(n, acc, sent, dense, link, compressor="gradpart", model="lenet5"):
    comp = None if sent is None else {"total_sent_bytes": sent, "total_dense_bytes": dense,
                                      "compression_ratio": dense / sent, "last_density": 0.01}
    return {"epoch": n, "test_acc": acc, "test_loss": 1.0 - acc, "train_loss": 0.5, "wall_s": 10.0 * n,
            "samples_per_s": 100.0 * n, "model": model, "dataset": "mnist5k", "compressor": compressor,
            "ranks": 2, "link_tx_bytes": link, "link_rx_bytes": link, "compression": comp}


NONE = [epoch(1, 0.90, None, None, 1000, "none"), epoch(2, 0.95, None, None, 2000, "none")]
GRADPART = [epoch(1, 0.88, 10, 1000, 100), epoch(2, 0.946, 30, 3000, 150)]


def bench_row(method, step_s, model="mlp", label="100mbit", ranks=2, sent=None, dense=None):
    comp = None if sent is None else {"last_sent_bytes": sent, "last_dense_bytes": dense}
    return {"method": method, "model": model, "label": label, "ranks": ranks, "params": 1000,
            "batch_per_rank": 10, "step_s": step_s, "samples_per_s": 10 * ranks / step_s,
            "compression": comp}


def test_ratios_per_epoch_from_accounting_and_link():
    assert br.epoch_ratios(GRADPART) == [100.0, 100.0]
    assert br.epoch_ratios(NONE) is None
    assert br.link_ratios(GRADPART, NONE) == [10.0, 20.0]


def test_summary_row_gap_and_link_ratio():
    row = br.summary_row("gradpart", GRADPART, NONE)
    assert row["gap_pp"] == pytest.approx(-0.4)
    assert row["link_ratio"] == pytest.approx(4000 / 300)
    assert row["samples_per_s"] == 200.0 and row["ratio"] == 100.0
    assert row["s_to_target"] == 20.0  # 0.946 >= 0.95 * 0.95 first at epoch 2
    assert math.isnan(br.seconds_to(GRADPART, 0.99))


def test_gap_row_averages_the_seeds_that_have_both_runs():
    worse = [GRADPART[0], {**GRADPART[1], "test_acc": 0.938}]
    by_seed = {0: {"none": NONE, "gradpart": GRADPART}, 1: {"none": NONE, "gradpart": worse},
               2: {"none": NONE}}
    row = br.gap_row("lenet5", by_seed)
    assert row["seeds"] == 2 and row["epochs"] == 2 and row["ratio"] == 100.0
    assert row["link_ratio"] == pytest.approx(4000 / 300)
    assert row["gap_pp"] == pytest.approx(-0.8) and row["gap_min"] == pytest.approx(-1.2)
    assert row["gap_sd"] == pytest.approx(math.sqrt(0.32)) and row["none_acc"] == 0.95
    assert br.gap_row("lenet5", {2: {"none": NONE}}) is None


def test_headline_shows_the_link_ratio_beside_the_compressor_ratio():
    text = report.headline_section([], {"lenet5": {"none": NONE, "gradpart": GRADPART}}, [])
    assert "| gradpart ratio | link ratio |" in text
    assert "| lenet5 | 2 | 0.950 | 0.946 | -0.4 | 100x | 13.3x |" in text


def test_seed_gaps_decide_the_accuracy_target_over_a_single_run():
    gap = {"model": "lenet5", "seeds": 3, "epochs": 10, "gap_pp": -0.6, "gap_min": -1.0,
           "gap_max": 0.1, "ratio": 90.0}
    lines = targets.accuracy_and_ratio({"lenet5": {"none": NONE, "gradpart": GRADPART}}, [gap])
    assert [line["status"] for line in lines] == ["missed", "missed"]
    assert lines[0]["measured"].startswith("-0.60 pp, mean of 3 seeds after 10 epochs")


def test_runs_keep_the_records_closing_an_epoch(tmp_path):
    (tmp_path / "lenet5").mkdir()
    mid = {**GRADPART[0], "epoch": 0.5, "epoch_end": False}
    ends = [{**r, "epoch_end": True} for r in GRADPART]
    (tmp_path / "lenet5" / "gradpart.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [mid, *ends]))
    assert br.load_runs(tmp_path) == {"lenet5": {"gradpart": ends}}


def test_markdown_dashes_missing_values():
    md = br.markdown([{"a": 1.5, "b": math.nan}], [("A", "a", ".1f"), ("B", "b", ".1f"), ("C", "c", "")])
    assert md.splitlines()[-1] == "| 1.5 | – | – |"


def test_densities_per_slot():
    recs = [{"step": s, "tensors": {"f/0": {"elements": 100, "sent_elements": s}}} for s in (5, 10)]
    assert br.densities(recs) == {"f/0": ([5, 10], [0.05, 0.1])}
    assert br.slot_sizes(recs) == {"f/0": 100}


def test_throughput_table_relates_to_bound_and_none():
    rows = [bench_row("compute-only", 0.01), bench_row("none", 1.0), bench_row("gradpart", 0.02)]
    line = table.table(rows).splitlines()[2]
    assert line.startswith("| mlp | 100mbit | 2 | per tensor | 2000 |")
    assert "1000 (0.50 of bound, 50.0x none)" in line
    grouped = table.table([{**r, "num_groups": 1} for r in rows]).splitlines()[2]
    assert grouped.startswith("| mlp | 100mbit | 2 | 1 | 2000 |")


def test_unshaped_targets_5_percent_when_compute_bound_10_for_many_tensors():
    def launch(model, bound_s):  # gradpart 8 % slower than none
        return [bench_row(m, s, model=model, label="10gbit") for m, s in
                (("compute-only", bound_s), ("none", 1.0), ("gradpart", 1.0 / 0.92))]
    rows = launch("resnet20", 0.8) + launch("lenet5", 0.5) + launch("resnet44", 0.5)
    lines = targets.compute_bound(br.group_throughput(rows))  # lenet5: none at half its bound, skipped
    assert [(t["target"], t["measured"], t["status"]) for t in lines] == [
        ("resnet20, 10gbit (compute-bound): gradpart <= 5 % slower than none", "+8.0 % slower", "missed"),
        ("resnet44, 10gbit (100+ tensors): gradpart <= 10 % slower than none", "+8.0 % slower", "met")]


def test_targets_met_and_missed():
    rows = [bench_row("compute-only", 0.01), bench_row("none", 1.0), bench_row("gradpart", 0.02)]
    topk = [epoch(1, 0.5, 1, 1, 1), {**epoch(2, 0.9, 2, 2, 2), "samples_per_s": 150.0}]
    status = {t["target"]: t["status"] for t in targets.check(rows, {"lenet5": {
        "none": NONE, "gradpart": GRADPART, "topk": topk}})}
    assert status["mlp, 100 Mbit/s: gradpart >= 0.8x compute-only bound"] == "missed"
    assert status["mlp, 100 Mbit/s: gradpart >= 40x none"] == "met"
    assert status["lenet5: gradpart final accuracy within 0.5 pp of none"] == "met"
    assert status["lenet5: gradpart compression ratio >= 100x"] == "met"
    assert status["lenet5: gradpart faster than the best peer at equal or better accuracy"] == "met"


def constants():
    group = {"compute-only": bench_row("compute-only", 0.01),
             "none": bench_row("none", 0.41), "gradpart": bench_row("gradpart", 0.1, sent=40, dense=3600)}
    return group, scaling.calibrate(group, bandwidth=10_000.0)


def test_calibration_reproduces_the_two_node_step_times():
    group, c = constants()
    assert c.dense_bytes == 4000 and c.small_bytes == 400 and c.sparse_bytes == 40
    assert c.efficiency == pytest.approx(4000 / (10_000 * 0.4))
    for method, kind in (("none", "dense"), ("gradpart", "sparse")):
        assert scaling.step_time(c, kind, 2, c.bandwidth) == pytest.approx(group[method]["step_s"])


def test_break_even_points_are_where_the_step_times_meet():
    _, c = constants()
    b = scaling.break_even_bandwidth(c, 8)
    assert scaling.step_time(c, "dense", 8, b) == pytest.approx(scaling.step_time(c, "sparse", 8, b))
    n = scaling.break_even_nodes(c, c.bandwidth)
    assert scaling.step_time(c, "sparse", n, c.bandwidth) >= scaling.step_time(c, "dense", n, c.bandwidth)
    assert scaling.step_time(c, "sparse", n - 1, c.bandwidth) < scaling.step_time(c, "dense", n - 1, c.bandwidth)
    assert scaling.rate_bytes("100mbit") == 12.5e6 and scaling.rate_bytes("x") is None


def test_report_writes_tables_plots_and_fills_docs(tmp_path):
    res = tmp_path / "bench"
    for kind, runs in (("convergence", {"none": NONE, "gradpart": GRADPART}), ("ablation", {"gradpart": GRADPART})):
        (res / kind / "lenet5").mkdir(parents=True)
        for name, records in runs.items():
            (res / kind / "lenet5" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    tensors = [{"step": 5, "epoch": 1, "tensors": {"f/0": {"elements": 100, "sent_elements": 2}}}]
    (res / "convergence" / "lenet5" / "gradpart.tensors.jsonl").write_text(json.dumps(tensors[0]) + "\n")
    rows = [bench_row("compute-only", 0.01), bench_row("none", 0.41),
            bench_row("gradpart", 0.1, sent=40, dense=3600)]
    for seed in (0, 1):
        (res / "gap" / f"seed{seed}" / "lenet5").mkdir(parents=True)
        for name, records in (("none", NONE), ("gradpart", GRADPART)):
            (res / "gap" / f"seed{seed}" / "lenet5" / f"{name}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in records))
    for name in ("throughput.jsonl", "scaling.jsonl"):
        (res / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = tmp_path / "results.md"
    docs.write_text("intro\n<!-- generated:targets -->\nold\n<!-- /generated:targets -->\n"
                    "<!-- generated:headline -->\n<!-- /generated:headline -->\nend\n")
    report.main(["--results", str(res), "--docs", str(docs)])
    text = docs.read_text()
    assert "old" not in text and "| lenet5: gradpart compression ratio >= 100x | 100x" in text
    assert text.startswith("intro\n") and text.endswith("end\n")
    assert "| lenet5 | 2 | 2 | 0.950 | 0.946 | -0.40 | 100x | 13.3x |" in text  # the seed means
    assert "-0.40 pp, mean of 2 seeds after 2 epochs" in text
    assert (res / "gap.csv").read_text().count("\n") == 5  # header, 2 seeds x 2 runs
    for png in ("throughput", "convergence-lenet5", "convergence-lenet5-ratio",
                "convergence-lenet5-density", "ablation-lenet5", "scaling"):
        assert (res / "plots" / f"{png}.png").stat().st_size > 1000
    assert (res / "convergence.csv").read_text().startswith("run,")


def test_grouped_table_shows_each_group_count_against_compute_only():
    from benchmarks import grouped
    ops = {"GLOO_ALLGATHER": {"per_step": 4, "tensors_each": 1, "median_ms": 0.15}}
    rows = [{"model": "resnet20", "method": m, "num_groups": g, "median_ms": ms, "min_ms": ms, "collectives": c}
            for m, g, ms, c in [("compute-only", 0, 100.0, {}), ("gradpart", 0, 150.0, {}),
                                ("gradpart", 1, 120.0, {}), ("gradpart", 4, 130.0, ops)]]
    rows[-1].update(rounds=2.0, density=0.0123)
    lines = grouped.markdown(rows).splitlines()
    assert lines[3].startswith("| resnet20 | gradpart | per tensor | - | 150.0, 150.0 | 1.50x | - |")
    assert lines[4].startswith("| resnet20 | gradpart | 1 | - | 120.0, 120.0 | 1.20x |")
    assert lines[5] == ("| resnet20 | gradpart | 4 | 1.23 % | 130.0, 130.0 | 1.30x "
                        "| 4 GLOO_ALLGATHER (1 tensors, 0.15 ms) | 2.0 |")


def test_the_budget_exponent_is_recovered_from_steps_that_fall_as_a_power_of_density():
    from benchmarks.studies import exponent
    records = [{"run": "none", "seed": 0, "compressor": "none", "options": {}, "step": 100, "test_acc": 0.9}]
    for density in (0.001, 0.003, 0.01, 0.03):
        reach = round(100 * density ** -0.2)  # progress per step ~ density**0.2
        records += [{"run": f"topk-{density}", "seed": 0, "compressor": "topk", "options": {"ratio": density},
                     "step": step, "test_acc": 0.9 if step >= reach else 0.5} for step in range(1, 1000)]
    pts = exponent.points(records, 0.95)
    assert [d for d, _ in pts] == [0.001, 0.003, 0.01, 0.03]
    assert exponent.fit(pts) == pytest.approx(0.2, abs=0.01)


def test_the_adam_table_gives_each_method_s_difference_from_no_compression():
    from benchmarks import adam_fit
    rows = [{"link": "20mbit", "compression": c, "seed": s, "test_accuracy": a}
            for c, s, a in [("none", 0, 0.96), ("none", 1, 0.95), ("gradpart", 0, 0.955), ("gradpart", 1, 0.935)]]
    lines = adam_fit.table(rows).splitlines()
    assert lines[2] == "| 20mbit | gradpart | 0.955 | 0.935 | -1.0 ± 0.5 |"
    assert lines[3] == "| 20mbit | none | 0.960 | 0.950 |  |"


def test_startup_counts_the_traced_graph_and_rates_each_first_step_against_none():
    import tensorflow as tf

    from benchmarks import startup

    compiled = tf.function(lambda x: x * 2.0, jit_compile=True)

    @tf.function
    def step(x):
        return tf.cond(x[0] > 0, lambda: compiled(x), lambda: x - 1.0)

    counts = startup.graph_counts(step.get_concrete_function(tf.TensorSpec([3])))
    assert (counts["conds"], counts["loops"], counts["xla_functions"]) == (1, 0, 1) and counts["nodes"] > 5
    row = lambda method, first: {"model": "mlp", "groups": 1, "gradients": 6, "method": method, "trace_s": 1.0,
                                 "first_call_s": first - 1.0, "first_step_s": first, "step_s": 0.02, **counts}
    lines = startup.table([row("none", 2.0), row("gradpart", 5.0)]).splitlines()
    assert "| none |" in lines[2] and "1.00x" in lines[2] and "| 2.50x |" in lines[3]


def test_synthetic_table_rates_images_and_wall_time_against_none_and_powersgd():
    from benchmarks import synthetic

    row = lambda method, imgs, wall: {"method": method, "img_sec_per_rank": imgs, "first_two_steps_s": 3.0,
                                      "launch_wall_s": wall, "ratio": 1.0}
    lines = synthetic.table([row("none", 2.0, 200.0), row("powersgd", 20.0, 50.0), row("gradpart", 16.0, 60.0)])
    gradpart = lines.splitlines()[-1]
    assert gradpart.startswith("| gradpart | 16.0 | 8.00x | 0.80x |") and "| 60 | 1.20x |" in gradpart
