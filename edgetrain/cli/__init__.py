"""The ``edgetrain`` command line: one module per subcommand, listed in ``COMMANDS``.

Each command module has a one-line docstring (the help text), ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("artifacts", "demo", "eval", "export", "plan", "profile", "reduce", "train")


def _module(name: str):
    return importlib.import_module(f"edgetrain.cli.{name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="edgetrain", description="On-device training of ONNX models")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        mod = _module(name)
        p = sub.add_parser(name, help=mod.__doc__.strip().splitlines()[0], description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(fn=mod.run)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # the command line, for "rebuild with" hints
    from ..errors import EdgetrainError
    try:
        return args.fn(args)
    except EdgetrainError as e:
        print(f"edgetrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgetrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
