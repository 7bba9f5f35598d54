"""Serving features that help only in some workloads: prefix caching, speculative decoding,
parallelism choice, prefill/decode disaggregation, a host KV tier, and the
verdicts that say which one matters for a deployment."""

from ._disagg import (
    DECODE_POOL_ENTRY_STEPS as DECODE_POOL_ENTRY_STEPS,
    DEFAULT_ORCHESTRATION_S as DEFAULT_ORCHESTRATION_S,
    DEFAULT_TRANSFER_LATENCY_S as DEFAULT_TRANSFER_LATENCY_S,
    Disaggregation as Disaggregation,
    colocated_decode_batch as colocated_decode_batch,
    disaggregation as disaggregation,
    kv_transfer_s as kv_transfer_s,
)
from ._disagg_load import (
    DisaggregationPercentiles as DisaggregationPercentiles,
    SplitServing as SplitServing,
    disaggregation_percentiles as disaggregation_percentiles,
    split_serving as split_serving,
)
from ._features_under_load import (
    LoadedFeature as LoadedFeature,
    prefix_serving_metrics as prefix_serving_metrics,
    prefix_workload as prefix_workload,
    speculative_serving_metrics as speculative_serving_metrics,
)
from ._host_tier import (
    PCIE5_X16_BYTES_PER_S as PCIE5_X16_BYTES_PER_S,
    HostTier as HostTier,
    host_tier as host_tier,
)
from ._parallel_choice import (
    ParallelOption as ParallelOption,
    best_parallelism as best_parallelism,
    parallelism_options as parallelism_options,
    with_parallelism as with_parallelism,
)
from ._reuse import (
    REUSE_REFERENCE_RATE_PER_S as REUSE_REFERENCE_RATE_PER_S,
    PrefixReuse as PrefixReuse,
    che_hit_rate as che_hit_rate,
    monotone_root as monotone_root,
    prefix_reuse as prefix_reuse,
    reusable_prefix_tokens as reusable_prefix_tokens,
    reuse_rate_per_s as reuse_rate_per_s,
)
from ._speculative import (
    MTP_LAYERS_PER_DRAFT_TOKEN as MTP_LAYERS_PER_DRAFT_TOKEN,
    AcceptanceRecord as AcceptanceRecord,
    SpeculativeBudget as SpeculativeBudget,
    acceptance_from_length as acceptance_from_length,
    acceptance_prior as acceptance_prior,
    expected_tokens_per_step as expected_tokens_per_step,
    load_acceptance as load_acceptance,
    speculative_decode as speculative_decode,
)
from ._verdicts import (
    VerdictBudgets as VerdictBudgets,
    verdict_budgets as verdict_budgets,
    verdicts as verdicts,
)
