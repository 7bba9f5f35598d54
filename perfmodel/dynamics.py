"""Serving dynamics: workloads, traces, token-budget batching, closed-form queueing, simulator.

Everything a user calls for latency under load (the load models and the simulator); ``perfmodel``
holds the static budgets.
"""

from ._batching import (
    DecodeCost as DecodeCost,
    EngineConfig as EngineConfig,
    IterationTokens as IterationTokens,
    decode_iteration_s as decode_iteration_s,
    decode_iterations_s as decode_iterations_s,
    iteration_s as iteration_s,
    prefill_budget_tokens as prefill_budget_tokens,
    saturated_batch as saturated_batch,
    saturated_output_tokens_per_s as saturated_output_tokens_per_s,
    seat_capacity as seat_capacity,
)
from ._closed_loop import (
    closed_loop_metrics as closed_loop_metrics,
    lockstep_share as lockstep_share,
)
from ._load_elasticity import (
    LOAD_ELASTICITY_STEP as LOAD_ELASTICITY_STEP,
    ttft_p95_load_elasticity as ttft_p95_load_elasticity,
)
from ._polling import (
    PollWait as PollWait,
    closed_loop_busy_probability as closed_loop_busy_probability,
    open_loop_busy_probability as open_loop_busy_probability,
    poll_wait as poll_wait,
)
from ._queueing import (
    allen_cunneen_wait_s as allen_cunneen_wait_s,
    ggc_wait_probability as ggc_wait_probability,
    kingman_wait_s as kingman_wait_s,
    lognormal_mixture_quantile as lognormal_mixture_quantile,
    lognormal_nodes as lognormal_nodes,
    mg1_conditional_wait_scv as mg1_conditional_wait_scv,
    mg1_wait_s as mg1_wait_s,
    replica_arrival_scv as replica_arrival_scv,
    wait_plus_quantile_s as wait_plus_quantile_s,
    wait_quantile_s as wait_quantile_s,
)
from ._serving import (
    CORRECTIONS as CORRECTIONS,
    KV_BOUND_OCCUPANCY as KV_BOUND_OCCUPANCY,
    OUTPUT_NODES as OUTPUT_NODES,
    PERCENTILE_QUANTILES as PERCENTILE_QUANTILES,
    PROMPT_NODES as PROMPT_NODES,
    QUANTILES as QUANTILES,
    Percentiles as Percentiles,
    ServingMetrics as ServingMetrics,
    engine_scaled as engine_scaled,
    is_closed_loop as is_closed_loop,
    is_kv_bound as is_kv_bound,
    serving_metrics as serving_metrics,
    serving_metrics_with_corrections as serving_metrics_with_corrections,
)
from ._serving_tail import (
    Corrections as Corrections,
    LoadPoint as LoadPoint,
    OpenLoop as OpenLoop,
    open_loop as open_loop,
)
from ._traces import (
    PRESETS as PRESETS,
    Trace as Trace,
    load_trace as load_trace,
    poisson_arrivals as poisson_arrivals,
    rescale_arrivals as rescale_arrivals,
    trace_path as trace_path,
    workload_from_trace as workload_from_trace,
)
from ._workload import (
    DEFAULT_OUTPUT_TOKENS as DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS as DEFAULT_PROMPT_TOKENS,
    Workload as Workload,
    lognormal_params as lognormal_params,
    sample_arrivals as sample_arrivals,
    sample_lengths as sample_lengths,
)
from .simulator import (
    EngineHooks as EngineHooks,
    SimResult as SimResult,
    simulate as simulate,
    summarize as summarize,
)
