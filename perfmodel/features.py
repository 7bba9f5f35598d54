"""Serving features that help only in some workloads: prefix caching, speculative decoding,
parallelism choice, expert parallelism, prefill/decode disaggregation, a host KV tier, and the
verdicts that say which one matters for a deployment."""

from ._disagg import (
    DEFAULT_ORCHESTRATION_S as DEFAULT_ORCHESTRATION_S,
)
from ._disagg import (
    DEFAULT_TRANSFER_LATENCY_S as DEFAULT_TRANSFER_LATENCY_S,
)
from ._disagg import (
    Disaggregation as Disaggregation,
)
from ._disagg import (
    disaggregation as disaggregation,
)
from ._disagg import (
    kv_transfer_s as kv_transfer_s,
)
from ._disagg_load import (
    DisaggregationPercentiles as DisaggregationPercentiles,
)
from ._disagg_load import (
    disaggregation_percentiles as disaggregation_percentiles,
)
from ._expert import (
    ExpertParallelStep as ExpertParallelStep,
)
from ._expert import (
    all_to_all_s as all_to_all_s,
)
from ._expert import (
    ep_decode_step as ep_decode_step,
)
from ._features_under_load import (
    LoadedFeature as LoadedFeature,
)
from ._features_under_load import (
    prefix_serving_metrics as prefix_serving_metrics,
)
from ._features_under_load import (
    speculative_serving_metrics as speculative_serving_metrics,
)
from ._host_tier import HostTier as HostTier
from ._host_tier import host_tier as host_tier
from ._parallel_choice import (
    ParallelOption as ParallelOption,
)
from ._parallel_choice import (
    best_parallelism as best_parallelism,
)
from ._parallel_choice import (
    parallelism_options as parallelism_options,
)
from ._parallel_choice import (
    with_parallelism as with_parallelism,
)
from ._reuse import (
    PrefixReuse as PrefixReuse,
)
from ._reuse import (
    che_hit_rate as che_hit_rate,
)
from ._reuse import (
    monotone_root as monotone_root,
)
from ._reuse import (
    prefix_reuse as prefix_reuse,
)
from ._reuse import (
    reusable_prefix_tokens as reusable_prefix_tokens,
)
from ._speculative import (
    AcceptanceRecord as AcceptanceRecord,
)
from ._speculative import (
    SpeculativeBudget as SpeculativeBudget,
)
from ._speculative import (
    acceptance_from_length as acceptance_from_length,
)
from ._speculative import (
    acceptance_prior as acceptance_prior,
)
from ._speculative import (
    expected_tokens_per_step as expected_tokens_per_step,
)
from ._speculative import (
    load_acceptance as load_acceptance,
)
from ._speculative import (
    speculative_decode as speculative_decode,
)
from ._verdicts import verdicts as verdicts
