"""benchmarks.report.wire_table: link ratio against the dense row, compressor ratio against 4 bytes per parameter."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from benchmarks.report.wire_table import table  # noqa: E402


def row(method, link, counted, groups=0):
    return {"label": "100mbit default", "model": "lenet5", "method": method, "num_groups": groups,
            "params": 1000, "link_per_step": link, "counted_sent_per_step": counted,
            "idle_per_s": 2500.0, "step_s": 0.05}


def test_ratios_and_units():
    lines = table([row("none", 80_000, 0), row("gradpart", 4_000, 100, groups=1)]).splitlines()
    assert lines[2] == "| 100mbit default | lenet5 | none | 0 | 80.0 | – | 0.0 | – | – | 2.5 | 50.0 |"
    assert lines[3] == "| 100mbit default | lenet5 | gradpart | 1 | 4.0 | 20.0x | 0.1 | 40x | – | 2.5 | 50.0 |"


def test_bytes_per_value_from_the_counted_values():
    counted = {**row("gradpart", 4_000, 350), "counted_values_per_step": 100}
    assert "| 4.0 | – | 0.3 | 11x | 3.50 | 2.5 |" in table([counted])


def test_rows_without_a_dense_reference_get_a_dash():
    assert "| 4.0 | – | 0.1 | 40x |" in table([row("gradpart", 4_000, 100)])


def test_each_model_is_divided_by_its_own_dense_row():
    mlp = {**row("gradpart", 2_000, 400), "model": "mlp", "params": 20_000}
    lines = table([row("none", 80_000, 0), {**row("none", 500_000, 0), "model": "mlp"},
                   row("gradpart", 4_000, 100), mlp]).splitlines()
    assert "| lenet5 | gradpart | 0 | 4.0 | 20.0x | 0.1 | 40x |" in lines[4]
    assert "| mlp | gradpart | 0 | 2.0 | 250.0x | 0.4 | 200x |" in lines[5]
    assert lines[-1].startswith("Link: tx + rx of rank 0's node")
