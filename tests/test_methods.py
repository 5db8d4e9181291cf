"""harness/methods.py: the one method grammar, ``NAME=COMPRESSOR[,KEY=VALUE...]`` or a bare ``NAME``."""
import argparse

import pytest

from harness import methods


def test_parse_gives_the_name_the_compressor_and_json_values():
    assert methods.parse("fixed=gradpart,entropy=false,fixed_density=0.001") == (
        "fixed", "gradpart", {"entropy": False, "fixed_density": 0.001})
    assert methods.parse("t=topk,value_encoding=fp16") == ("t", "topk", {"value_encoding": "fp16"})
    assert methods.parse("gradpart") == ("gradpart", "gradpart", {})
    assert methods.parse("g=gradpart,follow_link=False,fit=True") == (
        "g", "gradpart", {"follow_link": False, "fit": True})


@pytest.mark.parametrize("text, says", [("g=gradpart,fit", "KEY=VALUE"), ("g=gradpart,=1", "KEY=VALUE"),
                                        ("=topk", "NAME=COMPRESSOR"), ("x=", "NAME=COMPRESSOR"),
                                        ("a/b=topk", "NAME=COMPRESSOR")])
def test_parse_refuses_what_is_not_the_grammar(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        methods.parse(text)


def test_train_args_read_back_as_the_same_options():
    _, compressor, kwargs = methods.parse("no-fit=gradpart,fit=false,value_encoding=fp16,ratio=0.01")
    args = methods.train_args(compressor, methods.texts(kwargs))
    assert args == ["--compressor", "gradpart", "--compressor-option", "fit=false",
                    "--compressor-option", "value_encoding=fp16", "--compressor-option", "ratio=0.01"]
    assert dict(methods.option(a) for a in args[3::2]) == kwargs


def test_registered_refuses_a_compressor_the_registry_lacks():
    assert methods.registered("topk") == ("topk", "topk", {})
    assert methods.registered("fixed=gradpart,follow_link=false,margin=0.5") == (
        "fixed", "gradpart", {"follow_link": False, "margin": 0.5})
    with pytest.raises(argparse.ArgumentTypeError, match="not registered"):
        methods.registered("x=nosuch")


def test_build_goes_through_the_registry_or_names_a_class():
    from hvd_gradpart import TopKCompressor
    for name in ("topk", "hvd_gradpart:TopKCompressor"):
        compressor = methods.build(name, {"ratio": 0.05})
        assert isinstance(compressor, TopKCompressor) and compressor.ratio == 0.05


def test_the_shell_drivers_get_the_name_then_train_args(capsys):
    from benchmarks import train_args
    train_args.main(["no-fit=gradpart,fit=false"])
    assert capsys.readouterr().out.splitlines() == ["no-fit", "--compressor", "gradpart",
                                                    "--compressor-option", "fit=false"]
