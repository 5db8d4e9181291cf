"""The README's layout: a short tree of the repository, each line from a module's own docstring."""
import ast
from pathlib import Path

FOLDERS = {  # top-level folders that are not packages, and so hold no docstring of their own
    "scripts": "what a user runs: set-up, the demo, training, the edge cluster, launches, probes",
    "tests": ("two tiers, `make test` the fast one and `make test-all` everything; "
              "some files launch horovodrun themselves"),
    "results": "every committed result the report renders (JSONL, CSV, Markdown, plots)",
    "docs": "usage, methods, the algorithm, benchmarks, results, reliability, the cluster; notes/",
}
PACKAGES = {"harness": (), "benchmarks": ("report", "studies")}  # with the subpackages shown


def summary(path):
    """The first line of a module's (or a package's ``__init__``) docstring, without its full stop or reST quotes."""
    source = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(source.read_text())) if source.exists() else None
    return (doc or "").split("\n")[0].rstrip(".").replace("``", "")


def members(package):
    """A package's modules and subpackages, in name order, ``__init__`` and private ones left out."""
    return sorted(p for p in package.iterdir()
                  if (p.suffix == ".py" and not p.name.startswith("_")) or (p / "__init__.py").exists())


def line(name, text, indent=0):
    """One row of the tree: the name, indented, in a column of its own, then its summary."""
    label = " " * indent + name
    return f"{label:<24} {text}".rstrip()


def tree(root):
    """The layout as a Markdown code block: the library module by module, the other folders by one line."""
    root = Path(root)
    lines = [line("hvd_gradpart/", summary(root / "hvd_gradpart"))]
    lines += [line(p.name + ("/" if p.is_dir() else ""), summary(p), 2) for p in members(root / "hvd_gradpart")]
    for name, subpackages in PACKAGES.items():
        lines.append(line(name + "/", summary(root / name)))
        lines += [line(sub + "/", summary(root / name / sub), 2) for sub in subpackages]
    lines += [line(name + "/", text) for name, text in FOLDERS.items()]
    return "\n".join(["```", *lines, "```"])
