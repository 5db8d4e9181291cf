"""A method's name, then scripts/train.py's arguments for it, one a line: the shell drivers' parser.

    python -m benchmarks.train_args no-fit=gradpart,fit=false
"""
import argparse

from harness import methods


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", type=methods.parse, help=methods.GRAMMAR)
    name, compressor, kwargs = p.parse_args(argv).method
    print("\n".join([name, *methods.train_args(compressor, methods.texts(kwargs))]))


if __name__ == "__main__":
    main()
