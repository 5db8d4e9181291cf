"""Renderers: the tables, plots and docs' generated blocks made from results/ (``python -m benchmarks.report``)."""
