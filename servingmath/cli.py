"""``servingmath`` command line: parse, call the libraries, render.  No model logic here.

Each subcommand lives in ``servingmath/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``, and optionally ``check_arguments(args)``:
cheap cross-flag checks run right after parsing, before ``run`` does any work.  Bad input is
reported as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from pathlib import Path

from .errors import user_error_types

# ArviZ 0.x announces its 1.0 refactor on import (a multi-line FutureWarning, once a day); it says
# nothing about the user's input, so it must not precede a command's output.  Set before any
# command runs: ``fitting`` imports arviz lazily, inside the commands that use a posterior.
warnings.filterwarnings(
    "ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning
)

COMMANDS: tuple[str, ...] = (
    "explain",
    "simulate",
    "fit",
    "validate",
    "optimize",
    "fleet",
    "forecast",
    "pareto",
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


_FLAG_PREFIX = re.compile(r"^argument (-[\w-]+)(?:/-[\w-]+)*: (?=must )")
"""argparse's "argument --rate/--r: must be ..." prefix of a ``servingmath.options.validators`` message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        message = _FLAG_PREFIX.sub(r"\1 ", message)  # "--rate must be a positive number, ..."
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="servingmath",
        description="LLM-serving budgets: memory, compute, bandwidth, communication, queueing.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in _load_commands().items():
        # argparse %-formats help strings: a literal "90%" must reach it as "90%%"
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _check=getattr(module, "check_arguments", None))
    return parser


CPU_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false"
"""XLA flags every command runs with unless ``XLA_FLAGS`` already names them: the legacy
elemental CPU emitter instead of the per-fusion MLIR emitters.  Measured on the README's
optimize command on 2 busy cores, same answer: cold 226 -> 169 s and peak RSS 3.3 -> 2.0 GB;
warm 125 -> 118 s (no slower)."""


def _set_xla_flags() -> None:
    """Add ``CPU_XLA_FLAGS`` to ``XLA_FLAGS`` (read once, when JAX first starts its backend)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {CPU_XLA_FLAGS}".strip()


def main(argv: list[str] | None = None) -> int:
    _set_xla_flags()
    import jax

    jax.config.update("jax_enable_x64", True)  # exact byte counts and token capacities
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or bad input argparse already reported in one line
        return int(exc.code or 0)
    try:
        from .options.gpu_names import canonical_gpu_arguments

        canonical_gpu_arguments(args)
        if args._check is not None:
            args._check(args)
        enable_compile_cache()
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a reader that closed early shows up here, not at interpreter exit
        return code
    except BrokenPipeError:  # output piped into `head` and closed early: stop quietly
        _discard_stdout()
        return 0
    except KeyboardInterrupt:
        print("servingmath: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not isinstance(exc, user_error_types()):
            raise
        print(f"servingmath {args.command}: error: {exc}", file=sys.stderr)
        return 2


def cache_dir() -> Path:
    """The user's cache folder (``SERVINGMATH_CACHE``, default ``~/.cache/servingmath/jax``):
    compiled XLA programs, and under ``posteriors/`` the compact draw caches of the posteriors
    read (``fitting.load_posterior(cache_dir=...)``)."""
    return Path(os.environ.get("SERVINGMATH_CACHE", Path.home() / ".cache" / "servingmath" / "jax"))


def posterior_cache_dir() -> Path:
    return cache_dir() / "posteriors"


def enable_compile_cache() -> None:
    """Persist compiled XLA programs between runs, for every command (``cache_dir()``): a second
    run of the same shapes loads them instead of compiling.  A folder that cannot be made leaves
    the cache off."""
    import jax

    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", COMPILE_CACHE_MIN_SECONDS)


COMPILE_CACHE_MIN_SECONDS = 0.0
"""Compiles shorter than this are not written to the cache.  Every program is kept: the eager
(op-by-op) parts of a report compile one small program per operation and shape, ~20-40 ms each
on two cores, and a command such as ``explain`` dispatches ~70 of them, each loaded back from
disk in a few milliseconds (the cache key is computed on every compile whatever the threshold,
so keeping them costs only the write on the first run, a few KB each)."""


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the flush at interpreter exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
