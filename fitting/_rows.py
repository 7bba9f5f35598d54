"""Host side of the predictions: measurement rows -> numbers for the vectorised blocks.

Each row of the tidy table (``../shared/data/SCHEMA.md``) is classified (``gemm``, ``elementwise``,
``attention``, ``collective``, ``step``, ``closed``, ``open``), its shapes are derived from the model config,
TP degree and ``notes``, and it gets a GPU index, a noise group and (where identifiable) a
(source, group) offset cell.  Rows no budget covers are returned with a reason, never dropped.
Each kind's rows stack into its typed block (``_blocks.Blocks``); ``fitting._predict`` evaluates
the blocks in JAX.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist

import numpy as np
import pandas as pd

import perfmodel
from perfmodel import DTYPE_BYTES, KERNEL_FIELDS, Deployment, HardwareSpec, unnamed  # noqa: F401  (KERNEL_FIELDS re-exported)

from ._blocks import BLOCK_NAMES, BLOCK_TYPES, Blocks
from ._blocks_e2e import (
    E2E_METRICS,
    E2E_STATS,
    THROUGHPUT_COLUMNS,
    summary_column,
)
from ._blocks_step import STEP_METRICS, StepMetric  # noqa: F401  (re-exported)
from ._features import (  # noqa: F401  (re-exported)
    ACT_BYTES,
    LOW_PRECISION,
    _collective_features,
    _f,
    _model,
    _op_features,
    mlp_shape,
)
from ._groups import (  # noqa: F401  (re-exported: row grouping lives in _groups)
    COMM_GROUP,
    ELEMENTWISE_CLASS,
    ELEMENTWISE_OPS,
    GEMM_OPS,
    LATENCY_ANCHOR_SOURCES,
    OFFSET_OP_GROUPS,
    comm_cell,
    drawn_lengths,
    has_offset,
    latency_cells,
    lockstep,
    noise_key,
    notes_dict,
    source_key,
    unrecorded_prompt,
)
from ._names import E2E_SCENARIOS, EFFICIENCY_FIELDS, OFFSET_FIELDS  # noqa: F401  (re-exported)

SERVING_REASON = "end-to-end rows are fitted in the second (cut) stage, not by NUTS"


@lru_cache(maxsize=64)
def _hardware(gpu: str) -> HardwareSpec:
    return perfmodel.load_hardware(gpu)


@lru_cache(maxsize=256)
def _row_specs(model_id: str, gpu: str, tp: float, pp: float, wdt: str, kvdt: str):
    """Specs of one step row, renamed to a common static name so rows stack for ``vmap``."""
    m, h = unnamed(_model(model_id), "row"), unnamed(_hardware(gpu), "row")
    dep = Deployment.create(tp=int(tp), pp=int(pp), weight_dtype=wdt, kv_dtype=kvdt)
    return m, h, dep


def _step_features(row: pd.Series) -> tuple[tuple, dict[str, float]]:
    """A step row -> its (model, hardware, deployment) and ``StepRows`` numbers by field name."""
    key = (row["scenario"], row["metric"])
    if key not in STEP_METRICS:
        raise ValueError(f"no prediction for {row['scenario']} metric {row['metric']!r}")
    wdt = row["weight_dtype"] if row["weight_dtype"] in DTYPE_BYTES else "bf16"
    kvdt = (
        row["kv_dtype"]
        if row["kv_dtype"] in DTYPE_BYTES
        else (wdt if DTYPE_BYTES[wdt] >= 2 else "bf16")
    )
    tp, pp = (
        _f(row["tp"]) if _f(row["tp"]) > 0 else 1.0,
        _f(row["pp"]) if _f(row["pp"]) > 0 else 1.0,
    )
    specs = _row_specs(row["model"], row["gpu"], tp, pp, wdt, kvdt)
    inp, out = _f(row["input_len"]), _f(row["output_len"])
    out = 1.0 if not out > 0 else out
    b = _f(row["batch_size"])
    if not (inp > 0 and b > 0):
        raise ValueError("step rows need input_len and batch_size")
    ctx = _f(row["context_len"])
    ctx = inp + out / 2.0 if not ctx >= 0 else ctx
    return specs, {
        "prompt_tokens": inp,
        "output_tokens": out,
        "batch_size": b,
        "context_tokens": ctx,
        "metric": int(STEP_METRICS[key]),
    }


@dataclass
class Prepared:
    """Rows a budget covers, in table order, with the numbers ``predict`` needs.

    Attributes:
        table: the covered rows (original index kept).
        blocks: the rows' numbers, one typed block per kind of row; a block's ``pos`` places
            each of its rows in ``table``.
        gpus, cells, noise_keys: labels behind ``gpu_idx``, ``cell_idx``, ``noise_idx``; a cell is
            ``"<source>:<engine>|<noise key>"``, the unit of the source/discrepancy offset;
            ``cell_idx`` is -1 for rows of groups without an offset (``has_offset``).
        comm_idx: per row, the cell (``COMM_GROUP``) whose offset scales the collective latencies
            inside a multi-GPU whole-model prediction, or -1 (None: no such cells).
        log_value: log of the measured value per covered row.
        skipped: (original index, reason) of rows no budget covers.
    """

    table: pd.DataFrame
    blocks: Blocks
    gpus: tuple[str, ...]
    cells: tuple[str, ...]
    noise_keys: tuple[str, ...]
    gpu_idx: np.ndarray
    cell_idx: np.ndarray
    noise_idx: np.ndarray
    log_value: np.ndarray
    skipped: list[tuple[object, str]] = field(default_factory=list)
    comm_idx: np.ndarray | None = None


DEFAULT_TOKEN_BUDGET = 8192.0
"""Token budget of one iteration when a run does not record it: vLLM V1's serving default, the
TensorRT-LLM ``max_num_tokens`` default and SGLang's ``chunked_prefill_size`` on 80+ GB GPUs."""
DEFAULT_MAX_SEQS = 1024.0
"""Sequence cap when a run does not record it (offline runs: the KV cache binds first)."""
DEFAULT_REQUESTS_PER_CLIENT = 10.0
"""Requests per closed-loop client when the run does not say (InferenceMAX and ``vllm bench
serve`` defaults send 10 x concurrency prompts)."""
UNIFORM_LENGTH_LOW = 0.8
"""InferenceMAX draws lengths uniform in [0.8 L, L] (``--random-range-ratio 0.8``)."""
MLPERF_PROMPT_TOKENS = 256.0
"""Median of the uncertain mean prompt length of MLPerf rows, whose files carry no input length:
the geometric middle of the datasets' [64, 1024]-token prompts (not a measured mean)."""
MLPERF_PROMPT_RANGE_FACTOR = 4.0
"""The datasets' prompts span [64, 1024] tokens: the median / 4 to the median x 4."""
MLPERF_PROMPT_LOG_SD = math.log(MLPERF_PROMPT_RANGE_FACTOR) / NormalDist().inv_cdf(0.95)
"""Log-normal spread of that mean: 90 % of its mass in [64, 1024] tokens, the range of the
datasets' prompts.  The posterior predictive draws it (``prompt_z``), so an MLPerf
row's interval carries the length nobody recorded; the cut stage reads its median."""


def _lengths(row: pd.Series) -> tuple[float, float, float, float, float]:
    """(prompt mean, prompt CV, output mean, output CV, log-sd of an unrecorded prompt mean) as
    the benchmark drew them."""
    inp, out = _f(row["input_len"]), _f(row["output_len"])
    if drawn_lengths(row):
        mean_share = (1.0 + UNIFORM_LENGTH_LOW) / 2.0
        cv = (1.0 - UNIFORM_LENGTH_LOW) / math.sqrt(12.0) / mean_share
        return inp * mean_share, cv, out * mean_share, cv, 0.0
    if unrecorded_prompt(row):
        return MLPERF_PROMPT_TOKENS, 0.0, out, 0.0, MLPERF_PROMPT_LOG_SD
    return inp, 0.0, out, 0.0, 0.0


def _requests_per_client(row: pd.Series) -> float:
    """Requests each closed-loop client sends: the notes' ``num_prompts`` is either a multiple
    of the concurrency (InferenceMAX: "10x concurrency") or the run's total (``vllm bench serve``
    JSON: 500), which the clients share; unrecorded: ``DEFAULT_REQUESTS_PER_CLIENT``."""
    found = notes_dict(row.get("notes")).get("num_prompts", "").strip()
    number = re.match(r"[0-9.]+", found)
    if number is None:
        return DEFAULT_REQUESTS_PER_CLIENT
    value = float(number.group())
    if found[number.end() :].lstrip().startswith("x"):
        return value
    clients = _f(row.get("concurrency"))
    return max(value / clients, 1.0) if clients > 0 else DEFAULT_REQUESTS_PER_CLIENT


INFERENCEMAX_STREAM_TOKENS = (
    # (engine, model prefix, gpu, weight dtype or "" for any) -> tokens per streamed chunk
    (("sglang", "deepseek-ai/DeepSeek-R1", "b200", "fp8"), 30.0),
    (("sglang", "", "", ""), 10.0),
    (("trtllm", "", "", ""), 20.0),
)
"""Tokens per streamed chunk in InferenceMAX's launch scripts (SemiAnalysis InferenceMAX
``benchmarks/*.sh``): SGLang ``--stream-interval 10`` (``dsr1_fp8_h200_slurm.sh``, the FP4 B200
scripts) and 30 for DeepSeek-R1 FP8 on B200 (``dsr1_fp8_b200_docker.sh``); TensorRT-LLM
``stream_interval: 20`` in its extra options (``gptoss_fp4_*_trt_slurm.sh``); vLLM sets none
(one token per chunk).  The files record the clients' ITL, the gap between streamed chunks, not
this setting; each of its 901 runs' mean ITL / mean TPOT is within 2.1 % of it
(``test_predict``)."""


def _recorded_count(row: pd.Series, key: str, unit: str) -> float | None:
    """A run's launch setting recorded in its notes as ``key=N`` (a count >= 1), None where the
    notes do not say; ``ValueError`` naming the setting where N is not such a count."""
    found = notes_dict(row.get("notes")).get(key, "").strip()
    if not found:
        return None
    try:
        value = float(found)
    except ValueError:
        value = math.nan
    if not (value >= 1 and math.isfinite(value)):
        raise ValueError(f"{key}={found!r} in notes is not {unit} >= 1")
    return value


def stream_chunk_tokens(row: pd.Series) -> float:
    """Tokens the engine streamed per chunk in a serving run: the notes' ``stream_interval``
    (an engine's ``--stream-interval``) when recorded, InferenceMAX's launch-script setting for
    its rows, else 1 (every engine's default: vLLM, SGLang and TensorRT-LLM stream each token).

    A client's inter-token latency (ITL) is the gap between chunks it receives: with k tokens
    a chunk, its mean is k x the per-token gap (mean TPOT), while TPOT, TTFT and E2E are per
    request and unchanged."""
    recorded = _recorded_count(row, "stream_interval", "a token count")
    if recorded is not None:
        return recorded
    if str(row.get("source", "")) == "inferencemax":
        engine, model = str(row.get("engine", "")), str(row.get("model", ""))
        gpu, wdt = str(row.get("gpu", "")), str(row.get("weight_dtype", ""))
        for (e, m, g, w), tokens in INFERENCEMAX_STREAM_TOKENS:
            if e == engine and model.startswith(m) and g in ("", gpu) and w in ("", wdt):
                return tokens
    return 1.0


INFERENCEMAX_SCHEDULER_POLLS = (
    # (engine, model prefix, gpu) -> (iterations between polls below, at or above the concurrency)
    (("sglang", "deepseek-ai/DeepSeek-R1", "b200"), (10.0, 30.0)),
)
"""Forward iterations between the scheduler's polls for new requests in InferenceMAX's launch
scripts: SGLang's ``--scheduler-recv-interval`` is 10 below a concurrency of
``SCHEDULER_POLL_CONCURRENCY`` and 30 from it on in the DeepSeek-R1 B200 scripts (FP8 and FP4,
``dsr1_fp8_b200_docker.sh``, ``dsr1_fp4_b200_*.sh``); the H200 script and the vLLM and
TensorRT-LLM ones set none (the engine sees each request at its next iteration)."""
SCHEDULER_POLL_CONCURRENCY = 16.0


def scheduler_poll_iterations(row: pd.Series) -> float:
    """Forward iterations between the engine's polls for new requests in a serving run: the
    notes' ``scheduler_recv_interval`` (SGLang's ``--scheduler-recv-interval``) when recorded,
    InferenceMAX's launch-script setting for its rows, else 1 (every engine's default)."""
    recorded = _recorded_count(row, "scheduler_recv_interval", "an iteration count")
    if recorded is not None:
        return recorded
    if str(row.get("source", "")) == "inferencemax":
        engine, model, gpu = (str(row.get(c, "")) for c in ("engine", "model", "gpu"))
        for (e, m, g), (below, at_or_above) in INFERENCEMAX_SCHEDULER_POLLS:
            if e == engine and model.startswith(m) and g == gpu:
                clients = _f(row.get("concurrency"))
                return at_or_above if clients >= SCHEDULER_POLL_CONCURRENCY else below
    return 1.0


def _e2e_features(row: pd.Series) -> tuple[tuple, dict[str, float]]:
    """Serving (closed loop at ``concurrency`` or open loop at ``request_rate``) and saturated
    rows -> deployment specs and workload numbers (``perfmodel.closed_loop_metrics`` /
    ``serving_metrics``): the ``ServingRows`` fields by name, and ``open_loop`` (1.0 for an
    open-loop row, else 0.0).  Data-parallel replicas = num_gpus / (tp pp); an unrecorded tp is the
    smallest that holds the weights (MLPerf)."""
    metric = row["metric"]
    stat = row["stat"] if isinstance(row["stat"], str) else ""
    scenario = row["scenario"]
    conc, rate = _f(row["concurrency"]), _f(row["request_rate"])
    open_loop = scenario == "serving" and not conc > 0
    if metric in THROUGHPUT_COLUMNS:
        if stat not in ("", "mean"):
            raise ValueError(f"no prediction for throughput stat {stat!r}")
        col = THROUGHPUT_COLUMNS[metric]
    elif metric in E2E_METRICS and scenario == "serving":
        if stat not in E2E_STATS:
            known = ", ".join(sorted(k for k in E2E_STATS if k))
            raise ValueError(
                f"no prediction for {metric} stat {stat!r} (serving runs are predicted for {known})"
            )
        col = summary_column(E2E_METRICS[metric], E2E_STATS[stat])
    else:
        raise ValueError(f"no prediction for {scenario} metric {metric!r}")
    if open_loop and not (rate > 0 and math.isfinite(rate)):
        raise ValueError("serving rows need a concurrency or a finite request_rate")
    inp, inp_cv, out, out_cv, inp_log_sd = _lengths(row)
    if not (inp > 0 and out > 0):
        raise ValueError("end-to-end rows need input_len and output_len (or a dataset default)")
    wdt = row["weight_dtype"] if row["weight_dtype"] in DTYPE_BYTES else "bf16"
    kvdt = row["kv_dtype"] if row["kv_dtype"] in DTYPE_BYTES else "bf16"
    recorded = isinstance(row["weight_dtype"], str) and row["weight_dtype"].strip() != ""
    if not recorded and str(row["source"]).startswith("mlperf"):
        # NVIDIA's v4.1 recipe quantises to FP8 weights and an FP8 KV cache (data README)
        wdt = "fp8"
        kvdt = kvdt if row["kv_dtype"] in DTYPE_BYTES else "fp8"
    gpus = _f(row["num_gpus"])
    tp, pp = _f(row["tp"]), _f(row["pp"])
    pp = pp if pp > 0 else 1.0
    if not tp > 0:
        tp = float(_throughput_tp(row["model"], row["gpu"], wdt, kvdt, inp + out, _f(gpus)))
    tp, ep, attention_dp = _moe_parallelism(row, tp)
    gpus = gpus if gpus > 0 else tp * pp
    replicas = max(1.0, math.floor(gpus / (tp * pp)))
    polls = scheduler_poll_iterations(row)
    specs = _e2e_specs(
        row["model"],
        row["gpu"],
        tp,
        pp,
        replicas,
        wdt,
        kvdt,
        conc,
        polls,
        ep,
        attention_dp,
        # the closed loop reads prefill_first only at fixed lengths (its lockstep); a run whose
        # lengths are not known to be fixed is priced desynchronised whatever its engine
        1.0 if lockstep(row) else 0.0,
    )
    return specs, {
        "prompt_tokens_mean": inp,
        "prompt_tokens_cv": inp_cv,
        "prompt_mean_log_sd": inp_log_sd,
        "output_tokens_mean": out,
        "output_tokens_cv": out_cv,
        "concurrency": conc if conc > 0 else (1e9 if scenario == "saturated" else 0.0),
        "request_rate_per_s": rate if open_loop else 1.0,
        "requests_per_client": _requests_per_client(row) if scenario == "serving" else math.inf,
        "column": int(col),
        "stream_chunk_tokens": stream_chunk_tokens(row) if metric == "itl" else 1.0,
        "open_loop": float(open_loop),
    }


WEIGHT_SHARE_FOR_THROUGHPUT = 0.5
"""Largest share of a GPU's memory the weights take in a throughput run whose TP is not recorded
(MLPerf): a submitter tuning for tokens/s leaves at least as much memory to the KV cache as to the
weights (NVIDIA's v4.1 Llama-2-70B FP8 recipes: TP2 on 80 GB H100, TP1 on 141 GB H200)."""


@lru_cache(maxsize=256)
def _throughput_tp(
    model_id: str, gpu: str, wdt: str, kvdt: str, tokens: float, num_gpus: float
) -> int:
    """TP of a throughput run that does not record it: the smallest TP dividing the run's GPUs
    whose weight shard takes at most ``WEIGHT_SHARE_FOR_THROUGHPUT`` of a GPU's memory, else the
    smallest that holds the weights and a sequence."""
    model, hw = _model(model_id), _hardware(gpu)
    dep = Deployment.create(weight_dtype=wdt, kv_dtype=kvdt)
    found = perfmodel.smallest_fitting_parallelism(model, hw, dep, tokens)
    if found is None:
        raise ValueError("the model does not fit the system")
    gpus = int(num_gpus) if num_gpus > 0 else found[0]
    for tp in perfmodel.TP_CHOICES:
        if tp < found[0] or tp > min(gpus, int(hw.gpus_per_node)) or gpus % tp:
            continue
        if not perfmodel.tp_divides_heads(model, tp):
            continue
        trial = Deployment.create(tp=tp, weight_dtype=wdt, kv_dtype=kvdt)
        share = float(perfmodel.weight_bytes_per_gpu(model, trial)) / float(hw.hbm_bytes)
        if share <= WEIGHT_SHARE_FOR_THROUGHPUT:
            return tp
    return found[0]


def _moe_parallelism(row: pd.Series, tp: float) -> tuple[float, float, float]:
    """(ranks per stage, expert-parallel degree, attention data-parallel degree) of a run.

    aiconfigurator records the attention's TP as ``tp`` and its data-parallel groups as
    ``attention_dp_size`` in notes (``num_gpus = tp x pp x attention_dp``): the stage spans
    tp x a ranks.  InferenceMAX records the stage's ranks as ``tp`` and ``dp_attention=true``
    in notes when every rank runs its own attention (TensorRT-LLM ``enable_attention_dp``):
    a = tp.  ``ep`` is the expert-parallel degree of both (data README); one that does not
    divide the stage's ranks is not a layout the engines run, and counts as none.
    """
    notes = str(row.get("notes", ""))
    groups = re.search(r"attention_dp_size=(\d+)", notes)
    if groups:
        attention_dp = float(groups.group(1))
        ranks = tp * attention_dp
    else:
        attention_dp = tp if "dp_attention=true" in notes else 1.0
        ranks = tp
    ep = _f(row.get("ep"))
    ep = ep if ep >= 1 and ranks % ep == 0 else 1.0
    return ranks, ep, max(attention_dp, 1.0)


@lru_cache(maxsize=512)
def _e2e_specs(
    model_id, gpu, tp, pp, replicas, wdt, kvdt, conc, polls, ep=1.0, attention_dp=1.0, first=0.0
):
    m, h, _ = _row_specs(model_id, gpu, tp, pp, wdt, kvdt)
    seqs = conc if conc > 0 else DEFAULT_MAX_SEQS  # vLLM runs cap --max-num-seqs at the concurrency
    dep = Deployment.create(
        tp=int(tp),
        pp=int(pp),
        replicas=int(replicas),
        weight_dtype=wdt,
        kv_dtype=kvdt,
        max_num_seqs=float(max(seqs, 1.0)),
        max_num_batched_tokens=DEFAULT_TOKEN_BUDGET,
        scheduler_polls=float(polls),
        expert_parallel=float(ep),
        attention_dp=float(attention_dp),
        prefill_first=float(first),
    )
    return m, h, dep


def _skip_reason(row: pd.Series, serving: bool) -> str | None:
    notes = str(row.get("notes", ""))
    if row["scenario"] in E2E_SCENARIOS and not serving:
        return SERVING_REASON
    if "e2e_check=MISMATCH" in notes:
        return "source flags e2e_check=MISMATCH (data README: not usable as is)"
    if "POWER-CAPPED" in notes:
        return "power-capped H100 run (a different operating point than the catalog row)"
    if "duplicate_of=" in notes:
        return "duplicate of another row (data README)"
    if "pairwise" in notes and "cross-node" not in notes:
        # a pair rides its NVLink bridge, larger groups cross PCIe between pairs: the catalog's
        # one link figure per GPU cannot describe both paths
        return (
            "pairwise NVLink node: pairs bridged, pairs of pairs on PCIe (one catalog link figure)"
        )
    if not (_f(row["value"]) > 0):
        return "value is not a positive number"
    return None


def prepare(
    table: pd.DataFrame,
    *,
    gpus: tuple[str, ...] | None = None,
    cells: tuple[str, ...] | None = None,
    noise_keys: tuple[str, ...] | None = None,
    serving: bool = True,
) -> Prepared:
    """Turn measurement rows into prediction inputs; label sets extend the given ones (a fitted
    posterior's), so indices stay aligned with its parameters.  ``serving=False`` skips
    ``serving`` rows (the fit does: their closed-loop solve is costly inside NUTS)."""
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in BLOCK_TYPES}
    specs_of: dict[str, list[tuple]] = {name: [] for name in BLOCK_TYPES}
    kept, skipped = [], []
    for idx, row in table.iterrows():
        reason = _skip_reason(row, serving)
        if reason is None:
            try:
                hw = _hardware(row["gpu"])
                specs = None
                if row["scenario"] == "op":
                    kind, feats = _op_features(row, hw)
                    block = BLOCK_NAMES[kind]
                elif row["scenario"] == "collective":
                    block, feats = "collective", _collective_features(row, hw)
                elif row["scenario"] in E2E_SCENARIOS:
                    specs, feats = _e2e_features(row)
                    block = "open" if feats.pop("open_loop") else "closed"
                else:
                    block, (specs, feats) = "step", _step_features(row)
                if not all(math.isfinite(v) for v in feats.values() if v != math.inf):
                    raise ValueError("a needed column is empty")
                # a row's specs join its block only once every check passed (one entry per row)
                if specs is not None:
                    specs_of[block].append(specs)
                feats["pos"] = len(kept)
                rows[block].append(feats)
                kept.append(idx)
            except (perfmodel.CatalogError, KeyError, ValueError, TypeError) as exc:
                msg = (
                    str(exc).split(";")[0]
                    if isinstance(exc, perfmodel.CatalogError)
                    else f"{type(exc).__name__}: {exc}"
                )
                skipped.append((idx, f"not covered by a budget ({msg})"))
        else:
            skipped.append((idx, reason))
    kept_table = table.loc[kept]
    blocks = Blocks(
        **{
            name: (
                BLOCK_TYPES[name].from_rows(found, specs=specs_of[name])
                if specs_of[name]
                else BLOCK_TYPES[name].from_rows(found)
            )
            for name, found in rows.items()
            if found
        }
    )

    def labels(values: list, given) -> tuple[tuple[str, ...], dict[str, int]]:
        """``given`` then the new labels sorted, and each label's position."""
        out = list(given or ())
        out += sorted(set(values) - set(out) - {None})
        return tuple(out), {v: i for i, v in enumerate(out)}

    def index(names: list, position: dict[str, int]) -> np.ndarray:
        return np.asarray([position.get(c, -1) for c in names], dtype=int)  # None: -1

    gpu_rows = list(kept_table["gpu"])
    records = [r for _, r in kept_table.iterrows()]  # one pass over the table (iterrows is slow)
    nks = [noise_key(r) for r in records]
    sources = [source_key(r) for r in records]
    cell_rows = [(f"{src}|{k}" if has_offset(k, src) else None) for src, k in zip(sources, nks)]
    comm_rows = [comm_cell(r) for r in records]
    gpus_, gpu_position = labels(gpu_rows, gpus)
    cells_, cell_position = labels(cell_rows + comm_rows, cells)
    nks_, nk_position = labels(nks, noise_keys)
    return Prepared(
        kept_table,
        blocks,
        gpus_,
        cells_,
        nks_,
        index(gpu_rows, gpu_position),
        index(cell_rows, cell_position),
        index(nks, nk_position),
        np.log(kept_table["value"].to_numpy(float)),
        skipped,
        comm_idx=index(comm_rows, cell_position),
    )
