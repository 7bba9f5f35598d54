"""The recommendation in the discrete-event simulator, whatever its kind.

Colocated: ``perfmodel.dynamics.simulate`` on the deployment (chunk = the config's chunk).
Speculative: the same engine with a speculative ``perfmodel.dynamics.DecodeCost`` (k draft tokens, i.i.d.
acceptance alpha; MTP heads or the draft model).  Pool split: ``simulate_disaggregated`` (prefill
pool of p x replicas engines on the prefill GPU, KV hand-off, decode pool of d x replicas engines
with the speculation, if any), as ``servingmath simulate --disagg`` runs it.  Every pool runs at
its GPU's posterior-median efficiency.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from perfmodel import Efficiency, System

from ._describe import _select
from ._grid import (
    CHUNK,
    GPU,
    MNBT,
    POOL,
    PREFILL_GPU,
    SPEC,
    deployment_from_weights,
    grid_tables,
    one_hot_weights,
    prefill_pool_weights,
)
from ._problem import Problem


def _num(x) -> float | None:
    """JSON-safe number (None for the NaN of an empty percentile, e.g. no multi-token output)."""
    x = float(x)
    return x if np.isfinite(x) else None


def _median_efficiency(problem: Problem, gpu: int) -> Efficiency:
    eff = _select(problem.efficiency, gpu)
    return Efficiency(**{k: jnp.median(getattr(eff, k)) for k in eff.__dataclass_fields__})


def simulate_check(
    problem: Problem, config: np.ndarray, replicas: int, num_requests: int, seed: int = 0
) -> dict:
    """TTFT/TPOT/ITL percentiles of ``num_requests`` simulated requests at the workload's rate,
    and whether their p95s meet the SLO bounds (ITL's where the question bounds it: the bound
    is inf otherwise); ``kind`` says which simulator ran."""
    import equinox as eqx

    from perfmodel.dynamics import DecodeCost, simulate
    from perfmodel.simulator import (
        engine_summary,
        requests_from_workload,
        shared_prefix_caching,
        simulate_disaggregated,
    )

    g = problem.grid
    tables = grid_tables(g)
    weights = one_hot_weights(jnp.asarray(config), g)
    gpu, pre_gpu = int(config[GPU]), int(config[PREFILL_GPU])
    k = g.spec_k[int(config[SPEC])]
    spec = None
    if k > 0:
        draft = None if bool(problem.draft_is_mtp) else problem.draft_model
        spec = DecodeCost.speculation(
            int(k), float(problem.spec_acceptance[int(config[SPEC])]), draft
        )
    chunk = int(g.chunk_sizes[int(config[CHUNK])] or g.max_num_batched_tokens[int(config[MNBT])])
    pool = int(config[POOL])
    trace = requests_from_workload(problem.workload, num_requests, seed)
    # the closed forms reject no prompt: admit the longest sampled request (paged KV reserves
    # nothing for it)
    longest = float(np.max(trace.prompt_tokens + trace.output_tokens))

    def deployment(r: float, w=weights):
        dep = deployment_from_weights(w, tables, r)
        return eqx.tree_at(lambda d: d.max_model_len, dep, jnp.maximum(dep.max_model_len, longest))

    eff = _median_efficiency(problem, gpu)  # the colocated engines', or the decode pool's
    if pool == 0:
        dep = deployment(float(replicas))
        prefix = None
        if problem.prefix_cache:  # a seeded share of requests opens with the shared prefix
            prefix = shared_prefix_caching(
                trace.prompt_tokens,
                float(problem.prefix_shared_fraction),
                int(float(problem.prefix_tokens)),
                int(float(dep.block_size_tokens)),
                seed + 2,
            )
        res = simulate(
            System(problem.model, _select(problem.hardware, gpu), dep, eff),
            trace,
            seed=seed,
            chunk_tokens=chunk,
            speculation=spec,
            prefix=prefix,
        )
        kind = "speculative" if spec else "colocated"
        s = engine_summary(res, eff)
    else:
        p, d = g.pool_ratios[pool - 1]
        # the prefill pool at its own TP (``prefill_tp``)
        dep_p = deployment(float(replicas * p), prefill_pool_weights(weights))
        dep_d = deployment(float(replicas * d))
        hw_p = _select(problem.hardware, pre_gpu)
        eff_p = _median_efficiency(problem, pre_gpu)
        bw = float(problem.transfer_bytes_per_s)
        res = simulate_disaggregated(
            problem.model,
            eff_p,
            trace,
            prefill=(hw_p, dep_p),
            decode=(_select(problem.hardware, gpu), dep_d),
            transfer_bytes_per_s=bw if bw > 0 else float(hw_p.internode_bytes_per_s),
            transfer_latency_s=float(problem.transfer_latency_s),
            orchestration_s=float(problem.orchestration_s),
            seed=seed,
            speculation=spec,
            decode_efficiency=eff,
        )
        kind = "split" + (" + speculative" if spec else "")
        s = engine_summary(res, eff_p, eff)  # as the engines deliver them, as the verdict's
    ttft = {q: _num(s["ttft_s"][q]) for q in ("p50", "p95", "p99")}
    tpot = {q: _num(s["tpot_s"][q]) for q in ("p50", "p95", "p99")}
    itl = {q: _num(s["itl_s"][q]) for q in ("p50", "p95", "p99")}
    out = {
        "requests": num_requests,
        "kind": kind,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "itl_s": itl,
        "meets_slo": bool(
            ttft["p95"] is not None
            and ttft["p95"] <= float(problem.slo_ttft_p95_s)
            and (tpot["p95"] is None or tpot["p95"] <= float(problem.slo_tpot_p95_s))
            and (itl["p95"] is None or itl["p95"] <= float(problem.slo_itl_p95_s))
        ),
    }
    if res.spec_tokens_per_step is not None:
        out["spec_tokens_per_step"] = float(res.spec_tokens_per_step)
    return out
