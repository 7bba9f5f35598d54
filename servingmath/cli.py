"""``servingmath`` command line: parse, call the libraries, render.  No model logic here.

Each subcommand lives in ``servingmath/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``.  Bad input is reported as one line on stderr
with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import user_error_types

COMMANDS: tuple[str, ...] = (
    "explain",
    "simulate",
    "fit",
    "validate",
    "optimize",
    "fleet",
    "forecast",
    "gpus",
    "models",
)
"""Subcommands, in the order ``--help`` lists them; a missing module is simply not offered."""


def _load_commands() -> dict[str, object]:
    found = {}
    for name in COMMANDS:
        try:
            found[name] = importlib.import_module(f"servingmath.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"servingmath.commands.{name}":
                raise
    return found


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        self.exit(2, f"servingmath: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="servingmath",
        description="LLM-serving budgets: memory, compute, bandwidth, communication, queueing.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in _load_commands().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)  # exact byte counts and token capacities
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except Exception as exc:
        if not isinstance(exc, user_error_types()):
            raise
        print(f"servingmath {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("servingmath: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
