"""Speed a person feels: each command's wall time and peak memory, cold and warm, beside the import floor.

    python benchmarks/bench_cli_speed.py          # every command of the table below, cold + warm
    python benchmarks/bench_cli_speed.py --quick  # the import floor and the budget sheet only

Each command runs as a new process (``python -m servingmath ...``), first with an empty cache
(cold: ``SERVINGMATH_CACHE`` pointed at a fresh folder, so no compiled programs and no draw cache
of the posterior), then again with the cache it just filled (warm).  ``servingmath gpus`` (imports, catalogs, no JAX work) is the floor every figure
is divided by, measured in the same run: the machines are shared, so the ratios are what to
compare between runs.  Peak memory is the child's max RSS (``os.wait4``).  Targets:
warm explain <= 3 s, explain --rate <= 5 s, optimize (the README problem) <= 8 s,
simulate of 2,000 requests <= 5 s; the README command cold <= 30 s; every command <= 4 GB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

LLAMA = ["--model", "meta-llama/Llama-3.1-8B"]
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "gpus (import floor)": (["gpus"], None),
    "explain (budget sheet)": (["explain", *LLAMA, "--gpu", "h100-sxm"], 3.0),
    "explain --rate 5": (["explain", *LLAMA, "--gpu", "h100-sxm", "--rate", "5"], 5.0),
    "simulate 2,000 requests": (
        ["simulate", *LLAMA, "--gpu", "h100-sxm", "--rate", "5", "--requests", "2000"],
        5.0,
    ),
    "optimize (README problem)": (
        [
            "optimize",
            *LLAMA,
            "--gpus",
            "h100-sxm,a100-sxm-80gb,l40s",
            "--rate",
            "20",
            "--ttft-p95",
            "1",
            "--tpot-p95",
            "0.05",
        ],
        8.0,
    ),
}
"""Label -> (arguments, warm target in seconds or None)."""
QUICK = ("gpus (import floor)", "explain (budget sheet)")
GIB = 2.0**30


def _run(args: list[str], cache: str) -> tuple[float, float, int]:
    """(wall seconds, max RSS GiB, exit status) of one ``servingmath`` process (``os.wait4``
    gives that child's own resource usage)."""
    env = dict(os.environ, SERVINGMATH_CACHE=cache)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servingmath", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024 / GIB, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the import floor and the budget sheet")
    args = ap.parse_args()
    labels = QUICK if args.quick else tuple(COMMANDS)
    rows, floor = [], None
    with tempfile.TemporaryDirectory() as cache:
        for label in labels:
            argv, target = COMMANDS[label]
            cold, rss_cold, code_cold = _run(argv, cache)
            warm, rss_warm, code_warm = _run(argv, cache)
            rss_cold = max(rss_cold, rss_warm)
            floor = warm if floor is None else floor
            rows.append((label, cold, warm, warm / floor, rss_cold, target, code_cold or code_warm))
    print("| command | cold s | warm s | warm / floor | peak RSS GiB | warm target s | met |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for label, cold, warm, ratio, rss, target, code in rows:
        met = "-" if target is None else ("yes" if warm <= target else "no")
        status = "" if code == 0 else f" (exit {code})"
        print(
            f"| {label}{status} | {cold:.1f} | {warm:.1f} | {ratio:.1f} | {rss:.2f} "
            f"| {'' if target is None else f'{target:g}'} | {met} |"
        )
    return 0 if all(r[-1] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
