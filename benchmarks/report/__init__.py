"""The report: tables, plots and the docs' generated blocks, from results/."""
