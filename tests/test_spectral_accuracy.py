"""The 10-epoch accuracy study's plumbing: the reference runs copied into its layout, its gaps."""
import json

from benchmarks.studies import spectral_accuracy as study


def record(model, compressor, acc, ratio=None):
    return {"model": model, "compressor": compressor, "dataset": "mnist5k", "ranks": 2, "epoch": 10,
            "test_acc": acc, "test_loss": 0.1, "link_tx_bytes": 1, "link_rx_bytes": 1, "wall_s": 1.0,
            "samples_per_s": 1.0, "compression": {"compression_ratio": ratio} if ratio else None}


def write(path, rec):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec) + "\n")


def test_the_gap_is_taken_to_the_copied_reference_of_each_seed(tmp_path):
    references, out = tmp_path / "powersgd", tmp_path / "study"
    for seed, (none, gp) in enumerate([(0.930, 0.927), (0.940, 0.941)]):
        write(references / f"mlp-none-seed{seed}.jsonl", record("mlp", "none", none))
        write(out / f"seed{seed}" / "mlp" / "gradpart.jsonl", record("mlp", "gradpart", gp, ratio=100.0 + seed))
    study.copy_references([0, 1], out, references)
    assert (out / "seed1" / "mlp" / "none.jsonl").exists()
    lines = study.table(out).splitlines()
    assert lines[0].startswith("# GradPart after 10 epochs")
    row = [cell.strip() for cell in lines[4].split("|")[1:-1]]
    assert row == ["mlp", "gradpart", "2", "0.9350", "0.9340", "-0.10", "-0.3", "+0.1", "100"]
    assert len(lines) == 5  # no other run has a reference to compare with
