"""The evaluation of hvd_gradpart: measurement, derived figures, tables and plots.

Run everything from the repository root: the shell drivers take the cluster up and down and
launch the measurements, the Python entry points run with ``python -m benchmarks.<module>``,
and every result lands under ``results/``.

Drivers (edge cluster, root):
    ``suite.sh``: the whole suite, then the report (``make bench``; ``BENCH=full`` for all of it).
    ``tta`` (``python -m benchmarks.tta``): the time-to-accuracy matrix, models x links x methods
    x seeds, one ``scripts/train.py`` launch per run, resumable (``tta_plan``: its runs and stop
    rules; ``tta_table``: medians over seeds, best of the Top-k grid, the tables).
    ``throughput.sh``: samples/s of every method per model and link rate.
    ``convergence.sh``: training runs of one model with several compressor set-ups.
    ``scaling.sh``: the throughput benchmark on 2 and on 4 nodes.
    ``wire.sh``: link bytes per step and per idle second under several Horovod settings.

Entry points (``python -m benchmarks.<name>``):
    ``tta``: the time-to-accuracy matrix (above); ``--dry-run`` prints its plan.
    ``throughput``: one launch timing every method (run under ``horovodrun``).
    ``report``: tables, CSV/JSON summaries and plots; fills the generated blocks of the docs.
    ``table``: the Markdown throughput table of a ``throughput.jsonl``.
    ``cost``: compress + decompress time of every sparse method against one memory pass, one process.
    ``calibrate``: one compressor's density, ratio and accuracy per epoch, one process.
    ``threshold_variants``: short-run accuracy of GradPart's threshold variants, one process.
    ``simulate``: W data-parallel workers simulated exactly in one process (method studies:
    accuracy every quarter epoch, realized density and ratio, over seeds).
    ``diagnose``: the tables of ``simulate --diagnose``'s per-step records (residual against
    gradient, residual age, update and gradient norms, density per epoch and per tensor).
    ``frontier``: each simulated run against Top-k's accuracy-ratio frontier at the same bytes.
    ``projection``: simulated runs' time to accuracy on a link, by the scaling model's step time.
    ``wire``: link bytes per training step and per idle second (run under ``horovodrun``).
    ``wire_table``: the Markdown table of a ``wire.jsonl``.
    ``grouped``: per-tensor against grouped exchange, collectives per step from Horovod's
    timeline and step time (run under ``horovodrun``).

Library modules: ``timeline`` (collectives in a Horovod timeline), ``records`` (reading result files, derived figures), ``targets`` (the
evaluation's targets checked against results), ``scaling`` (the analytic scaling model),
``plots`` (the figures).
"""
