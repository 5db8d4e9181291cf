"""The evaluation: the instruments behind the published figures, and their drivers.

Run everything from the repository root: the shell drivers take the cluster up and down and
launch the measurements, the Python entry points run with ``python -m benchmarks.<module>``,
and every result lands under ``results/``. A method is ``NAME=COMPRESSOR[,KEY=VALUE...]`` or a
registered name (``harness/methods.py``) wherever one is taken.

Drivers (edge cluster, root):
    ``suite.sh``: the whole suite, then the report (``make bench``; ``BENCH=full`` for all of it).
    ``throughput.sh``: samples/s of every method per model and link rate.
    ``convergence.sh``: training runs of one model with several methods (``train_args``: a
    method's ``scripts/train.py`` arguments).
    ``scaling.sh``: the throughput benchmark on 2 and on 4 nodes.
    ``wire.sh``: link bytes per step and per idle second under several Horovod settings.

Entry points (``python -m benchmarks.<name>``):
    ``tta``: the time-to-accuracy matrix, models x links x methods x seeds, one ``scripts/train.py``
    launch per run, resumable; ``--dry-run`` prints its plan (``tta_plan``: its runs and stop rules).
    ``throughput``: one launch timing every method (run under ``horovodrun``).
    ``wire``: link bytes per training step and per idle second (run under ``horovodrun``).
    ``grouped``: per-tensor against grouped exchange, collectives per step from Horovod's
    timeline and step time (run under ``horovodrun``).
    ``startup``, ``synthetic``, ``linkdrop``, ``elastic``, ``adam_fit``: the first step, Horovod's
    synthetic benchmark, a link that drops mid-run, nodes that leave and return, Adam under ``fit``.
    ``cost``, ``real_gradients``, ``formats``, ``chained``: one-process costs, bytes and graphs.
    ``simulate``: W data-parallel workers simulated exactly in one process (accuracy every
    quarter epoch, realized density and ratio, over seeds; ``--diagnose``: per-step records).
    ``frontier``: each simulated run against Top-k's accuracy-ratio frontier at the same bytes.
    ``projection``: simulated runs' time to accuracy on a link, by the scaling model's step time.

Shared modules: ``cluster`` (the lock, the cluster at a rate, two-rank launches), ``records``
(reading result files, derived figures), ``scaling`` (the analytic scaling model), ``timeline``
(collectives in a Horovod timeline), ``matched`` (Top-k at another method's density), ``diagnose``
(simulate's per-step recorder).

``report/``: tables, plots and the docs' generated blocks (``python -m benchmarks.report``).
``studies/``: one-off method studies no published table depends on.
"""
