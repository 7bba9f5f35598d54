"""``servingmath optimize``: the cheapest configuration meeting the SLO with stated confidence.

Shared argument helpers for ``fleet`` and ``forecast`` live here too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import perfmodel as pm
from perfmodel import CatalogError
from perfmodel.dynamics import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS

from .._options import require_mtp
from .._posterior_cli import add_engine_argument
from .._progress import Phases, callback, run_with_phases
from .._render import human_seconds, table
from .._types import (
    assignments,
    finite_float,
    fraction,
    nonnegative_float,
    nonnegative_int,
    output_dir,
    output_file,
    positive_float,
    positive_int,
    probability,
    workload_source,
)
from ..errors import UsageError
from ..reports import provenance

HELP = "cheapest deployment meeting p95 TTFT/TPOT SLOs with stated confidence (gradient search)"


# ------------------------------------------------------------------ shared by fleet / forecast


def add_problem_arguments(
    parser: argparse.ArgumentParser, *, workload: bool = True, prefix: bool = True
) -> None:
    """--model, --gpus, SLOs, confidence, posterior, prices (the load, when ``workload``; a
    shared prefix, when ``prefix``)."""
    parser.add_argument("--model", required=True, help="Hugging Face id or config.json path")
    parser.add_argument("--gpus", required=True, help="candidate hardware ids, comma-separated")
    if workload:
        parser.add_argument("--rate", type=positive_float, help="arrival rate, requests/s")
        parser.add_argument(
            "--workload",
            type=workload_source,
            help="trace file or preset (rate, lengths, burstiness)",
        )
    parser.add_argument(
        "--input-len",
        type=positive_float,
        help=f"mean prompt tokens (default {DEFAULT_PROMPT_TOKENS})",
    )
    parser.add_argument(
        "--output-len",
        type=positive_float,
        help=f"mean output tokens (default {DEFAULT_OUTPUT_TOKENS})",
    )
    parser.add_argument(
        "--output-cv", type=nonnegative_float, default=1.0, help="output-length CV (default 1)"
    )
    if prefix:
        parser.add_argument(
            "--prefix-reuse",
            type=fraction,
            metavar="FRACTION",
            help="share of requests that open with one shared prefix, served from a prefix "
            "cache (with --prefix-len; colocated engines without speculation)",
        )
        parser.add_argument(
            "--prefix-len",
            type=positive_float,
            metavar="N",
            help="shared prefix length, tokens (with --prefix-reuse)",
        )
    parser.add_argument(
        "--ttft-p95",
        "--slo-ttft-p95",
        dest="ttft_p95",
        type=positive_float,
        help="p95 time-to-first-token bound, seconds",
    )
    parser.add_argument(
        "--tpot-p95",
        "--slo-tpot-p95",
        dest="tpot_p95",
        type=positive_float,
        help="p95 time-per-output-token bound, seconds",
    )
    parser.add_argument(
        "--itl-p95",
        "--slo-itl-p95",
        dest="itl_p95",
        type=positive_float,
        help="p95 inter-token latency bound, seconds (one gap between consecutive tokens of a "
        "request, over gaps: a gap that carries a prefill chunk counts in full)",
    )
    parser.add_argument(
        "--confidence",
        type=probability,
        default=0.9,
        help="probability over the posterior that the SLO holds (default 0.9)",
    )
    parser.add_argument("--posterior", help="fitted posterior (.nc); default: the bundled one")
    add_engine_argument(parser)
    parser.add_argument(
        "--prior", action="store_true", help="use spec-sheet prior draws, no posterior"
    )
    parser.add_argument(
        "--draws", type=positive_int, default=200, help="posterior draws (default 200)"
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="PRNG seed (default 0)")
    parser.add_argument("--prices", help="prices CSV (columns gpu,price_per_gpu_hour)")
    parser.add_argument("--hardware-csv", help="hardware CSV with your own rows")
    parser.add_argument(
        "--quality-penalty",
        type=assignments(finite_float),
        default="",
        help="cost surcharge per dtype, e.g. int4=0.1,fp8=0.02 (fractions)",
    )
    parser.add_argument(
        "--kv-dtypes",
        default="bf16,fp8",
        help="KV-cache dtypes to consider (default bf16,fp8; also int8,int4)",
    )
    parser.add_argument(
        "--weight-dtypes",
        default="bf16,fp8",
        help="weight dtypes to consider (default bf16,fp8; also int4)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def problem_from_args(
    args: argparse.Namespace,
    model,
    gpus,
    workload,
    efficiency,
    hardware,
    *,
    speculation: dict | None = None,
    **extra,
):
    """``optimize.make_problem`` with the SLOs, confidence, knob grid, quality penalty, prefix
    and speculation the command line gives (``speculation``: ``speculation_from_args`` already
    read, else read here; ``extra``: the transfer setting ``optimize`` adds)."""
    from optimize import make_problem

    if speculation is None:
        speculation = speculation_from_args(args, model)
    share, length = getattr(args, "prefix_reuse", None), getattr(args, "prefix_len", None)
    if (share is None) != (length is None):
        raise UsageError("--prefix-reuse and --prefix-len go together; pass both or neither")
    if length is not None and length > float(workload.prompt_tokens_mean):
        raise UsageError(
            f"--prefix-len {length:.0f} is longer than the {float(workload.prompt_tokens_mean):.0f}"
            "-token mean prompt; pass a prefix no longer than the prompt"
        )
    try:
        return make_problem(
            model,
            gpus,
            workload,
            slo_ttft_p95_s=args.ttft_p95,
            slo_tpot_p95_s=args.tpot_p95,
            slo_itl_p95_s=getattr(args, "itl_p95", None),
            max_model_len=getattr(args, "max_model_len", None),
            confidence=args.confidence,
            grid=grid_from_args(args, len(gpus), args.max_replicas),
            efficiency=efficiency,
            hardware=hardware,
            quality_penalty=args.quality_penalty,
            prefix_reuse=share,
            prefix_tokens=length,
            **speculation,
            **extra,
        )
    except (ValueError, CatalogError) as exc:
        raise UsageError(str(exc)) from None


def grid_from_args(args: argparse.Namespace, num_gpus: int, max_replicas: int):
    """The knob grid with the dtypes the user allows."""
    from optimize import Grid
    from perfmodel import DTYPE_BYTES

    dtypes = {}
    for flag, text in (("--kv-dtypes", args.kv_dtypes), ("--weight-dtypes", args.weight_dtypes)):
        items = tuple(t.strip() for t in text.split(",") if t.strip())
        bad = [t for t in items if t not in DTYPE_BYTES]
        if bad or not items:
            raise UsageError(
                f"{flag}: unknown dtype {bad[0] if bad else '(empty)'!r}; use some of "
                f"{','.join(DTYPE_BYTES)}"
            )
        dtypes[flag] = items
    if max_replicas < 1:
        raise UsageError(f"--max-replicas must be >= 1, got {max_replicas}")
    extra = {}
    if getattr(args, "chunk_sizes", None) is not None:
        extra["chunk_sizes"] = _int_list(args.chunk_sizes, "--chunk-sizes", "512,2048,8192")
        if min(extra["chunk_sizes"]) > max(Grid(1).max_num_batched_tokens):
            raise UsageError(
                f"--chunk-sizes: every chunk exceeds the largest token budget "
                f"{max(Grid(1).max_num_batched_tokens)}; pass smaller chunks, e.g. 512,2048"
            )
    if getattr(args, "pool_ratios", None) is not None:
        extra["pool_ratios"] = _ratios(args.pool_ratios)
    elif hasattr(args, "pool_ratios") and getattr(args, "prefix_reuse", None) is None:
        # a prefix cache is priced for colocated engines: no default pool split beside it
        extra["pool_ratios"] = _ratios(DEFAULT_POOL_RATIOS)
    if getattr(args, "spec_draft", None):
        extra["spec_k"] = SPEC_K
    return Grid(
        num_gpus=num_gpus,
        kv_dtypes=dtypes["--kv-dtypes"],
        weight_dtypes=dtypes["--weight-dtypes"],
        max_replicas=max_replicas,
        **extra,
    )


SPEC_K = (0, 1, 2, 3, 4, 5, 6, 7, 8)
"""Speculative draft lengths offered with --spec-draft (0 = off)."""

DEFAULT_CHUNKS = "512,1024,2048,4096,8192"
DEFAULT_POOL_RATIOS = "1:1,2:1,3:1,1:2"


def _int_list(text: str, flag: str, example: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UsageError(
            f"{flag} {text!r} must be positive integers, comma-separated, e.g. {example}"
        )
    return tuple(sorted(set(values)))


def _ratios(text: str) -> tuple[tuple[int, int], ...]:
    """``1:1,2:1`` -> ((1, 1), (2, 1)); ``none`` -> () (colocated only)."""
    if text.strip().lower() in ("none", "off", ""):
        return ()
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            p, d = (int(x) for x in item.split(":"))
        except ValueError:
            p = d = 0
        if p < 1 or d < 1:
            raise UsageError(
                f"--pool-ratios: {item!r} is not PREFILL:DECODE engines (each >= 1); "
                "pass e.g. --pool-ratios 1:1,2:1 or none"
            )
        out.append((p, d))
    return tuple(dict.fromkeys(out))


def gpu_ids(args: argparse.Namespace) -> tuple[str, ...]:
    """The hardware ids of --gpus, each once (``UsageError`` when empty or repeated)."""
    gpus = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    if not gpus:
        raise UsageError("--gpus is empty; pass e.g. --gpus h100-sxm,a100-sxm-80gb")
    if len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus lists a GPU twice: {args.gpus}")
    return gpus


def check_slo_arguments(args: argparse.Namespace) -> None:
    """One-line ``UsageError`` for an SLO bound that is not a positive finite number of seconds
    and for a --max-model-len that is not a whole number of tokens >= 1 (before any work)."""
    itl = getattr(args, "itl_p95", None)
    for flag, v in (
        ("--ttft-p95", getattr(args, "ttft_p95", None)),
        ("--tpot-p95", getattr(args, "tpot_p95", None)),
        ("--itl-p95", itl),
    ):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"{flag} must be a positive number of seconds, e.g. 0.1, got {v}")
    if itl is not None and getattr(args, "command", None) == "pareto":
        raise UsageError(
            "--itl-p95 does not filter the pareto frontier (it bounds optimize, fleet and "
            "forecast); filter with --tpot-p95"
        )
    length = getattr(args, "max_model_len", None)
    if length is not None and not (math.isfinite(length) and length >= 1 and length == int(length)):
        raise UsageError(
            f"--max-model-len must be a whole number of tokens >= 1, e.g. 32768, got {length}"
        )


def resolve_common(args: argparse.Namespace):
    """(model, gpu ids, loaded hardware, efficiency draws) with one-line errors for bad input."""
    from optimize import efficiency_draws_for

    if not 0.0 < args.confidence < 1.0:
        raise UsageError(
            f"--confidence {args.confidence} must be strictly between 0 and 1, e.g. 0.9"
        )
    check_slo_arguments(args)
    if args.draws < 1:
        raise UsageError(f"--draws must be at least 1, got {args.draws}")
    gpus = gpu_ids(args)
    try:
        model = pm.load_model(args.model)
        hardware = [
            pm.load_hardware(g, prices_csv=args.prices, hardware_csv=args.hardware_csv)
            for g in gpus
        ]
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    context = pm.model_context_tokens(args.model)
    length = getattr(args, "max_model_len", None)
    if length is not None and context is not None and length > context:
        raise UsageError(
            f"--max-model-len {int(length):,} exceeds {model.name}'s context of {context:,} "
            "tokens (its config.json), above which vLLM refuses to start; "
            f"lower --max-model-len to at most {context}"
        )
    for g, h in zip(gpus, hardware):
        if not math.isfinite(float(h.price_per_gpu_hour)):
            raise UsageError(
                f"no price for GPU {g!r}; pass --prices with a row gpu={g},price_per_gpu_hour=..."
            )
    posterior = None
    if not args.prior:
        import fitting

        from ..cli import posterior_cache_dir

        try:
            posterior = fitting.load_posterior(args.posterior, cache_dir=posterior_cache_dir())
        except (OSError, ValueError, fitting.PosteriorError) as exc:
            raise UsageError(
                f"cannot load posterior {args.posterior or '(bundled)'}: {exc}; "
                "pass --posterior FILE.nc or --prior"
            ) from None
    efficiency = efficiency_draws_for(
        gpus, args.draws, posterior=posterior, seed=args.seed, engine=args.engine
    )
    return model, gpus, hardware, efficiency


def resolve_workload(args: argparse.Namespace, rate: float | None = None):
    """Workload from --workload (trace) and/or --rate, --input-len, --output-len."""
    from perfmodel.dynamics import Workload, load_trace, workload_from_trace

    rate = args.rate if rate is None else rate
    if getattr(args, "workload", None):
        try:
            wl = workload_from_trace(load_trace(args.workload), arrival_rate_per_s=rate)
        except CatalogError as exc:
            raise UsageError(str(exc)) from None
        if not math.isfinite(float(wl.arrival_rate_per_s)):
            raise UsageError(f"trace {args.workload} has no timestamps; pass --rate R")
    else:
        if rate is None:
            raise UsageError("give the load: --rate R (requests/s) or --workload TRACE")
        wl = Workload(arrival_rate_per_s=rate, output_tokens_cv=args.output_cv)
    updates = {}
    if args.input_len is not None:
        updates["prompt_tokens_mean"] = args.input_len
    if args.output_len is not None:
        updates["output_tokens_mean"] = args.output_len
    for k, v in updates.items():
        if not (math.isfinite(v) and v >= 1):
            raise UsageError(
                f"--{k.split('_')[0].replace('prompt', 'input')}-len must be >= 1, got {v}"
            )
    fields = {f: getattr(wl, f) for f in wl.__dataclass_fields__}
    fields.update(updates)
    if not float(fields["arrival_rate_per_s"]) > 0:
        raise UsageError(f"--rate must be positive, got {fields['arrival_rate_per_s']}")
    return Workload(**fields)


# ------------------------------------------------------------------ optimize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser)
    parser.add_argument(
        "--max-replicas", type=positive_int, default=64, help="largest replica count (default 64)"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the re-check with the closed forms (serving_metrics, its speculative and "
        "disaggregated forms)",
    )
    parser.add_argument(
        "--simulate",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="also run the recommendation through the simulator on N requests (two pools "
        "for a split, speculation for k > 0)",
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs here: cost vs SLO probability, posterior of p95 TTFT/TPOT",
    )
    add_report_argument(parser)
    parser.add_argument(
        "--max-model-len",
        type=_context_tokens,
        default=None,
        metavar="TOKENS",
        help="context length every engine must serve (vLLM --max-model-len, SGLang "
        "--context-length, TensorRT-LLM --max_seq_len; default: the workload's longest "
        "requests; at most the model's own context, from its config.json); a configuration "
        "whose KV cache cannot hold one sequence this long is infeasible",
    )
    parser.add_argument(
        "--emit",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write the recommendation's launch scripts (vllm.sh, sglang.sh, trtllm.sh) and a "
        "Kubernetes deployment.yaml (one Deployment per pool) into this folder",
    )
    add_chunk_argument(parser)
    parser.add_argument(
        "--pool-ratios",
        default=None,
        metavar="P:D,...",
        help="prefill:decode engine ratios of disaggregated pools to consider, or none "
        f"(default {DEFAULT_POOL_RATIOS}; none with --prefix-reuse)",
    )
    parser.add_argument(
        "--transfer-bw",
        type=positive_float,
        metavar="BYTES_PER_S",
        help="KV hand-off bandwidth per GPU between pools (default: inter-node network)",
    )
    add_speculation_arguments(parser)


def add_chunk_argument(
    parser: argparse.ArgumentParser, default: str | None = DEFAULT_CHUNKS
) -> None:
    """--chunk-sizes: the prefill chunks the search offers (optimize, fleet, forecast; None:
    one chunk, the whole token budget)."""
    said = default if default is not None else "one chunk of max_num_batched_tokens"
    parser.add_argument(
        "--chunk-sizes",
        default=default,
        metavar="N,...",
        help=f"prefill chunk sizes to consider (<= max_num_batched_tokens; default {said})",
    )


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    """--spec-draft / --spec-acceptance: speculative decoding as a knob of the search (optimize,
    fleet, forecast); ``speculation_from_args`` reads them."""
    parser.add_argument(
        "--spec-draft",
        metavar="MODEL|mtp",
        help="offer speculative decoding with this draft (k = 0..8 becomes a knob)",
    )
    parser.add_argument(
        "--spec-acceptance",
        type=fraction,
        metavar="A",
        help="per-token draft acceptance in [0, 1] (default: prior from measured lengths)",
    )


def check_speculation_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --spec-draft mtp only for a model with MTP layers (a caller
    that bypasses the parser may leave the option out)."""
    draft = getattr(args, "spec_draft", None)
    if draft and draft.lower() == "mtp":
        require_mtp(args.model)


def speculation_from_args(args: argparse.Namespace, model) -> dict:
    """``make_problem``'s speculation arguments from --spec-draft / --spec-acceptance."""
    return {"spec_draft": _spec_draft(args, model), "spec_acceptance": args.spec_acceptance}


def _context_tokens(text: str) -> int:
    """--max-model-len: a whole number of tokens >= 1 (``argparse`` turns the error into one
    line and exit status 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(
            f"must be a whole number of tokens >= 1, e.g. 32768, got {text!r}"
        )
    return int(value)


def run(args: argparse.Namespace) -> int:
    return run_with_phases(args, _run)


def _run(args: argparse.Namespace, phases: Phases) -> int:
    from optimize import recommend

    phases("loading the posterior")
    model, gpus, hardware, efficiency = resolve_common(args)
    workload = resolve_workload(args)
    speculation = speculation_from_args(args, model)
    draft = speculation["spec_draft"]
    try:
        problem = problem_from_args(
            args,
            model,
            gpus,
            workload,
            efficiency,
            hardware,
            transfer_bytes_per_s=args.transfer_bw,
            speculation=speculation,
        )
    except (ValueError, CatalogError) as exc:
        raise UsageError(str(exc)) from None
    rec = recommend(
        problem,
        gpus,
        model.name,
        verify=not args.no_verify,
        simulate_requests=args.simulate,
        draft_name=None if isinstance(draft, str) or draft is None else draft.name,
        progress=callback(phases),
    )
    out = rec.to_json()
    out["question"] = provenance.question(args, model.name, gpus, workload)
    out["assumptions"] = provenance.assumptions(args, gpus, hardware)
    figures = []
    if (args.plot or args.report) and out["feasible"]:
        phases("drawing the figures")
        figures = _figures(problem, gpus, out)
    if args.report:
        from ..reports.pages import optimize_page

        write_report(args.report, optimize_page(out, [(c, f) for _, c, f in figures]))
    if args.plot:
        from optimize.plots import save_figure

        phases.done()
        for name, _, fig in figures:
            print(f"figure: {save_figure(fig, Path(args.plot) / name)}", file=sys.stderr)
        if not figures:
            print("no figures: nothing feasible to plot", file=sys.stderr)
    close_figures(f for _, _, f in figures)
    phases.done()
    if args.emit and out["feasible"]:
        from ..reports.launch import launch_files

        for name, text in launch_files(out).items():
            write_text(Path(args.emit) / name, text, executable=name.endswith(".sh"))
        print(f"launch files: {args.emit}", file=sys.stderr)
    if args.report and out["feasible"]:
        print(f"report: {args.report}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    if not out["feasible"]:
        print(f"servingmath: error: {infeasible_message(out, args, gpus)}", file=sys.stderr)
        return 2
    if not args.json:
        print(render(out, args))
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """Before the posterior loads: --spec-draft mtp only for a model with MTP layers; --report
    and --emit are writable (re-checked here for callers that bypass the parser's types)."""
    check_slo_arguments(args)
    check_speculation_arguments(args)
    check_output_paths(args, files=("report",), folders=("emit",))


def _figures(problem, gpus, out: dict) -> list[tuple[str, str, object]]:
    """(file name, caption, open Figure) of both optimize figures, from one ``plot_numbers``."""
    from optimize.plots import NAMES, latency_figure, plot_numbers, tradeoff_figure

    numbers = plot_numbers(problem, gpus, out)
    return [
        (
            NAMES["tradeoff"],
            (
                "Cost against the probability over the posterior that the SLO holds (search model): "
                "the recommendation (star), its runner-ups, and its configuration at every replica "
                "count."
            ),
            tradeoff_figure(problem, gpus, out, numbers),
        ),
        (
            NAMES["latency"],
            (
                "p95 TTFT and p95 TPOT (and p95 ITL where the question bounds it) of the "
                "recommendation in each posterior draw, with the SLO bounds."
            ),
            latency_figure(problem, gpus, out, numbers),
        ),
    ]


# ------------------------------------------------------------------ output files (shared)


def add_report_argument(parser: argparse.ArgumentParser) -> None:
    """``--report FILE.html`` (validated while parsing: its folder exists and is writable)."""
    parser.add_argument(
        "--report",
        type=output_file,
        default=None,
        metavar="FILE.html",
        help="write a self-contained HTML report (question, answer, intervals, assumptions, "
        "figures), built from the --json output",
    )


def check_output_paths(
    args: argparse.Namespace, *, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()
) -> None:
    """``UsageError`` naming the flag when an output file (``output_file``) or folder
    (``output_dir``) given in ``args`` cannot be written."""
    for names, check in ((files, output_file), (folders, output_dir)):
        for name in names:
            value = getattr(args, name, None)
            if value is None:
                continue
            try:
                check(value)
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--{name}: {exc}") from None


def write_report(path: str, page: str) -> None:
    """Write an HTML page (UTF-8)."""
    write_text(Path(path), page)


def write_text(path: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` at ``path`` (UTF-8; its folder created), mode 0755 when ``executable``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if executable:
        path.chmod(EXECUTABLE_MODE)


EXECUTABLE_MODE = 0o755
"""rwxr-xr-x: a launch script its owner and others can run."""


def close_figures(figures) -> None:
    """Close matplotlib figures (releases pyplot's reference to each); with none, pyplot (~1 s
    to import) is not loaded."""
    figures = list(figures)
    if not figures:
        return
    import matplotlib.pyplot as plt

    for fig in figures:
        plt.close(fig)


def _spec_draft(args: argparse.Namespace, model):
    """None, "mtp" or the draft ``ModelSpec`` of --spec-draft; one-line errors for bad input."""
    if not args.spec_draft:
        if args.spec_acceptance is not None:
            raise UsageError("--spec-acceptance needs --spec-draft MODEL|mtp")
        return None
    if args.spec_draft.lower() == "mtp":
        return "mtp"
    try:
        draft = pm.load_model(args.spec_draft)
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
    if float(draft.total_params) >= float(model.total_params):
        raise UsageError(
            f"--spec-draft {draft.name} is not smaller than {model.name}; pick a smaller draft or mtp"
        )
    return draft


def infeasible_message(out: dict, args: argparse.Namespace, gpus) -> str:
    """One line: what cannot be met, the closest achievable bound and where, and the flag to relax."""
    near = out["closest_achievable"] or {}
    if near.get("scale") is None:
        return (
            f"no candidate in --gpus {','.join(gpus)} fits the model and keeps up with the load at "
            f"{args.max_replicas} replicas (binding: {out['binding_constraint']}); add larger GPUs "
            "or raise --max-replicas"
        )
    wanted = []
    if args.ttft_p95 is not None:
        wanted.append(f"p95 TTFT <= {args.ttft_p95:g} s")
    if args.tpot_p95 is not None:
        wanted.append(f"p95 TPOT <= {args.tpot_p95:g} s")
    if getattr(args, "itl_p95", None) is not None:
        wanted.append(f"p95 ITL <= {args.itl_p95:g} s")
    name = out["binding_constraint"]
    if name not in ("ttft_p95", "tpot_p95", "itl_p95"):
        name = "tpot_p95"
    key = f"{name}_s"
    flag = f"--slo-{name.replace('_', '-')}"
    best = near[key]
    where = (near.get("configs") or {}).get(key) or {}
    on = f" on {where['gpu']} TP{where['tp']} PP{where['pp']}" if where else ""
    if where.get("disaggregation"):
        on += f" ({where['disaggregation']['prefill']['gpu']} prefill pool)"
    text = (
        f"no configuration meets {' and '.join(wanted)} with confidence {args.confidence}; "
        f"the best achievable is {best:.3g} s{on}; relax {flag} to >= {best:.3g}"
    )
    if len(wanted) >= 2 and near["scale"] > 1:
        both = "both bounds" if len(wanted) == 2 else "every bound"
        text += f" (or scale {both} by x{near['scale']:.3g})"
    return text


def _latency_text(d: dict | None) -> str:
    if not d:
        return "-"
    return " / ".join(
        human_seconds(d[k]) if d[k] is not None else "inf" for k in ("p50", "p95", "p99")
    )


def render(out: dict, args: argparse.Namespace) -> str:
    """Human report of a ``Recommendation.to_json()`` object."""
    if not out["feasible"]:
        near = out["closest_achievable"] or {}
        if near.get("scale") is None:
            return (
                "infeasible: no candidate fits the model and keeps up with the load at "
                f"{args.max_replicas} replicas (binding: {out['binding_constraint']}); "
                "add larger GPUs or raise --max-replicas"
            )
        return (
            "infeasible: no candidate meets the SLO with confidence "
            f"{args.confidence} (binding: {out['binding_constraint']}); closest achievable: "
            f"TTFT p95 {human_seconds(near['ttft_p95_s'])} alone, TPOT p95 "
            f"{human_seconds(near['tpot_p95_s'])} alone, "
            + (
                f"ITL p95 {human_seconds(near['itl_p95_s'])} alone, "
                if getattr(args, "itl_p95", None) is not None
                else ""
            )
            + f"or both bounds x{near['scale']:.3g}"
        )
    rows = [
        (
            "configuration",
            f"{out['replicas']} x {out['gpu']} (TP {out['tp']}, PP {out['pp']}) = {out['num_gpus']} GPUs",
        ),
        ("dtypes", f"weights {out['weight_dtype']}, KV {out['kv_dtype']}"),
        ("max_model_len", f"{out['max_model_len']:,} tokens (one sequence's KV fits)"),
        (
            "token budget",
            (
                f"max_num_batched_tokens {out['max_num_batched_tokens']}, prefill chunk "
                f"{out['chunk_size']}, max_num_seqs {out['max_num_seqs']}"
            ),
        ),
        (
            "cost",
            f"${out['cost_per_hour']:.2f}/hour, ${out['cost_per_million_output_tokens']:.3f} per million output tokens",
        ),
        ("SLO probability", f"{out['slo_probability']:.3f} (required {args.confidence})"),
        ("TTFT p50/p95/p99", _latency_text(out["ttft_s"])),
        ("TPOT p50/p95/p99", _latency_text(out["tpot_s"])),
        *(
            [("ITL p50/p95/p99", _latency_text(out.get("itl_s")))]
            if getattr(args, "itl_p95", None) is not None
            else []
        ),
        ("binding", f"{out['binding_constraint']} (budget: {out['binding_budget']})"),
    ]
    if out.get("metrics_model"):
        rows.append(("numbers from", out["metrics_model"]))
    if out.get("speculative"):
        s = out["speculative"]
        rows.insert(
            3,
            (
                "speculative",
                (
                    f"{s.get('draft_model', s['draft'])} k={s['k']}, acceptance "
                    f"{s['acceptance']:.2f} -> {s['tokens_per_step']:.2f} tokens/step"
                ),
            ),
        )
    if out.get("disaggregation"):
        d = out["disaggregation"]
        p, q = d["prefill"], d["decode"]
        rows[0] = (
            "configuration",
            (
                f"prefill pool {p['replicas']} x {p['gpu']} + decode pool {q['replicas']} x "
                f"{q['gpu']} (TP {out['tp']}, PP {out['pp']}) = {out['num_gpus']} GPUs"
            ),
        )
        rows.insert(1, ("KV hand-off", f"{human_seconds(d['kv_transfer_s'])} per mean prompt"))
    for k, v in out["shadow_prices"].items():
        if v:
            rows.append((f"shadow price {k}", f"{v:+.3g} $/hour per second"))
    el = ", ".join(f"{k} {v:+.2f}" for k, v in out["cost_elasticities"].items() if abs(v) > 1e-3)
    rows.append(("d log cost / d log", el or "-"))
    text = "recommendation\n" + table(rows)
    if out["alternatives"]:
        text += "\nrunner-up configurations\n" + table(
            [
                (
                    f"{a['replicas']} x {a['gpu']} TP{a['tp']} PP{a['pp']}"
                    + (
                        f" (split, prefill on {a['disaggregation']['prefill']['gpu']})"
                        if a.get("disaggregation")
                        else ""
                    ),
                    f"${a['cost_per_hour']:.2f}/hour ({a['weight_dtype']} weights, {a['kv_dtype']} KV)",
                )
                for a in out["alternatives"]
            ]
        )
    if out.get("simulator"):
        sim = out["simulator"]
        text += (
            f"\nsimulator ({sim.get('kind', 'colocated')}, {sim['requests']} requests, median "
            f"efficiency): TTFT {_latency_text(sim['ttft_s'])}, "
            f"TPOT {_latency_text(sim['tpot_s'])}"
            + (
                f", ITL {_latency_text(sim['itl_s'])}"
                if out.get("question", {}).get("slo_itl_p95_s")
                else ""
            )
            + f"; SLO {'met' if sim['meets_slo'] else 'NOT met'}"
        )
    e = out["engine_args"]
    text += f"\nengine flags\n  {e['vllm']}\n  {e['sglang']}\n  {e['trtllm']}"
    if e["notes"]:
        text += f"\n  note: {e['notes']}"
    return text


def describe_short(problem, gpus, config) -> str:
    """One line: TP/PP, dtypes, token budget (and a prefill chunk below it) and speculation of
    a configuration."""
    from optimize import describe_config

    d = describe_config(problem, gpus, config, 1)
    spec = d["speculative"]
    chunk = d["chunk_size"]
    return (
        f"TP {d['tp']} PP {d['pp']}, weights {d['weight_dtype']}, KV {d['kv_dtype']}, "
        f"max_num_batched_tokens {d['max_num_batched_tokens']}, max_num_seqs {d['max_num_seqs']}"
        + (f", prefill chunk {chunk}" if chunk < d["max_num_batched_tokens"] else "")
        + (f", speculative {spec['draft']} k {spec['k']}" if spec else "")
    )
