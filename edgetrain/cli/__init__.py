"""The ``edgetrain`` command line: one module per subcommand, listed in ``COMMANDS``.

Each command module has a one-line docstring (the help text), ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("artifacts", "demo", "eval", "export", "federated", "ops", "plan", "profile", "reduce", "train",
            "warm")


class DefaultsHelp(argparse.HelpFormatter):
    """Help that shows each option's default, unless it has none (None, a switch) or the text already says."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def _module(name: str):
    """The command's module, or None where this installation leaves it out (the trimmed runtime has the device
    commands train and eval only)."""
    try:
        return importlib.import_module(f"edgetrain.cli.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"edgetrain.cli.{name}":
            raise
        return None


def main(argv=None) -> int:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="edgetrain", description="On-device training of ONNX models")
    parser.add_argument("--version", action="version", version=f"edgetrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        mod = _module(name)
        if mod is None:
            continue
        p = sub.add_parser(name, help=mod.__doc__.strip().splitlines()[0], description=mod.__doc__,
                           formatter_class=DefaultsHelp)
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
    except BrokenPipeError:          # `edgetrain ops | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
