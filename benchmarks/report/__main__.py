"""``python -m benchmarks.report``: every table and plot from results/, into docs/results.md and README.md."""
from benchmarks.report.build import main

main()
