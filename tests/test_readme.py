"""The README: one screen long enough, and a layout that cannot drift from the modules' docstrings."""
import re
from pathlib import Path

from benchmarks.report import layout

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_at_most_120_lines_and_says_when_gradpart_is_the_right_choice():
    assert len(README.splitlines()) <= 120
    first_screen = README[:README.index("<!-- /generated:tta-headline -->")]
    assert "## When it is the right choice" in first_screen and "make test" not in first_screen
    assert "<!-- generated:pick -->" in first_screen


def test_the_layout_block_is_the_tree_the_module_docstrings_give():
    block = re.search(r"<!-- generated:layout -->\n(.*?)\n<!-- /generated:layout -->", README, re.S).group(1)
    assert block == layout.tree(ROOT), "run `make report` to regenerate the README's layout"


def test_every_library_module_has_a_one_line_summary():
    for path in layout.members(ROOT / "hvd_gradpart"):
        assert layout.summary(path), f"{path} has no docstring to summarize"
        assert f"  {path.name}" in layout.tree(ROOT)
