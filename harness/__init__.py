"""The evaluation's models, embedded data, training loop and time to accuracy (not the library).

Used by scripts/, benchmarks/ and tests/; not part of the library (``pip install .`` ships only
hvd_gradpart)."""
