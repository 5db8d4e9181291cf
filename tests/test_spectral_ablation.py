"""The spectral ablation study's plumbing: the matrix's reference runs reused, its variants parsed, its table."""
import json

from benchmarks import tta_plan as tp
from benchmarks.studies import spectral_ablation as study


def write_run(folder, model, link, method, seed, status="done"):
    path = folder / model / link / f"{method}-seed{seed}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": 1, "test_acc": 0.5}) + "\n")
    path.with_name(path.stem + ".steps.jsonl").write_text("")
    tp.append_index(folder, {"model": model, "link": link, "method": method, "seed": seed, "status": status,
                             "file": str(path.relative_to(folder)), "compressor": method, "options": []})


def test_only_the_reference_runs_asked_for_are_reused_once(tmp_path):
    matrix, out = tmp_path / "tta", tmp_path / "study"
    out.mkdir()
    write_run(matrix, "mlp", "20mbit", "none", 0)
    write_run(matrix, "mlp", "20mbit", "none", 1, status="failed")
    write_run(matrix, "mlp", "100mbit", "none", 0)
    write_run(matrix, "mlp", "20mbit", "topk", 0)
    for _ in range(2):
        study.reuse_reference(["mlp"], ["20mbit"], [0, 1], out, matrix)
    assert list(tp.read_index(out)) == [("mlp", "20mbit", "none", 0)]
    assert len((out / "index.jsonl").read_text().splitlines()) == 1
    assert (out / "mlp" / "20mbit" / "none-seed0.steps.jsonl").exists()


def test_every_variant_parses_as_the_matrix_reads_it():
    names = [tp.parse_method(m).name for m in study.METHODS]
    assert names == ["gp-coords", "gp-key", "gp-both", "powersgd", "powersgd-r2", "powersgd-r4"] == study.NAMES


def test_a_study_with_no_runs_has_its_heading_only(tmp_path):
    assert study.table(tmp_path).splitlines() == [
        "# Spectral key area: time to accuracy (`python -m benchmarks.studies.spectral_ablation`)"]
