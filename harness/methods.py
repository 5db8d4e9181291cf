"""The method grammar of every entry point: ``NAME=COMPRESSOR[,KEY=VALUE...]``, or a bare ``NAME``.

A method is a compressor of the library's registry (``hvd_gradpart.get_compressor``) with keyword
arguments, under a name for files and tables: ``no-fit=gradpart,fit=false`` is GradPart without
its fit, ``topk`` Top-k at its defaults. A value is JSON where it parses (``false``, ``0.01``),
else text (``fp16``). Studies may name a class, ``cond=benchmarks.studies.gradpart_variants:Cond``.
"""
import argparse
import importlib
import json
import re

GRAMMAR = "NAME=COMPRESSOR[,KEY=VALUE...]"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%-]*")  # a name becomes a file name


def option(text):
    """``KEY=VALUE`` -> ``(key, value)``, the value decoded as JSON where it parses (Python's
    ``True``/``False`` too)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if value in ("True", "False"):
        return key, value == "True"
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse(text):
    """``NAME=COMPRESSOR[,KEY=VALUE...]`` or ``NAME`` -> ``(name, compressor, kwargs)``.

    Raises:
        argparse.ArgumentTypeError: not the grammar, or a name that cannot be a file name.
    """
    name, sep, spec = text.partition("=")
    compressor, *pairs = spec.split(",") if sep else [name]
    if not NAME.fullmatch(name) or not compressor:
        raise argparse.ArgumentTypeError(
            f"expected {GRAMMAR} (NAME: letters, digits and . _ % - only), got {text!r}")
    return name, compressor, dict(option(pair) for pair in pairs)


def registered(text):
    """``parse``, refusing a compressor the library's registry lacks (an argparse type)."""
    from hvd_gradpart import COMPRESSORS
    name, compressor, kwargs = parse(text)
    if compressor not in COMPRESSORS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {compressor!r} is not registered ({', '.join(sorted(COMPRESSORS))})")
    return name, compressor, kwargs


def texts(kwargs):
    """``kwargs`` as ``KEY=VALUE`` texts that ``option`` reads back."""
    return tuple(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in kwargs.items())


def train_args(compressor, options=()):
    """scripts/train.py's arguments for ``compressor`` with ``options`` (``KEY=VALUE`` texts)."""
    return ["--compressor", compressor, *[a for o in options for a in ("--compressor-option", o)]]


def build(compressor, kwargs):
    """The compressor: from the library's registry, or ``module:Class`` with ``kwargs``."""
    if ":" not in compressor:
        from hvd_gradpart import get_compressor
        return get_compressor(compressor, **kwargs)
    module, cls = compressor.split(":", 1)
    return getattr(importlib.import_module(module), cls).from_options(**kwargs)

