"""The evaluation's harness: models, embedded data, training loop and time-to-accuracy bookkeeping.

Used by scripts/, benchmarks/ and tests/; not part of the library (``pip install .`` ships only
hvd_gradpart)."""
