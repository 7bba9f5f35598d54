"""Discrete-event simulator of an iteration-level continuous-batching engine (the referee of the
closed forms in ``perfmodel.dynamics``), using the same ``forward_step`` step time."""

from ._disagg import simulate_disaggregated as simulate_disaggregated
from ._engine import (
    EngineHooks as EngineHooks,
    EngineLimits as EngineLimits,
    EngineRun as EngineRun,
    run_engine as run_engine,
)
from ._features import (
    PrefixCaching as PrefixCaching,
    shared_prefix_caching as shared_prefix_caching,
    synthetic_prefix_hashes as synthetic_prefix_hashes,
    synthetic_prefix_hit_rate as synthetic_prefix_hit_rate,
    synthetic_shared_requests as synthetic_shared_requests,
)
from ._prefix_cache import (
    MOONCAKE_BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS,
    BlockPrefixCache as BlockPrefixCache,
    load_mooncake_trace as load_mooncake_trace,
    replay_reused_tokens as replay_reused_tokens,
    replay_trace_reuse as replay_trace_reuse,
    shared_prefix_requests as shared_prefix_requests,
    simulate_prefix_cache as simulate_prefix_cache,
)
from ._records import (
    STABLE_GROWTH_SHARE as STABLE_GROWTH_SHARE,
    DecodeGaps as DecodeGaps,
    SimResult as SimResult,
    backlog_growth_share as backlog_growth_share,
    engine_summary as engine_summary,
    kept_requests as kept_requests,
    queue_stable as queue_stable,
    summarize as summarize,
)
from ._requests import length_limits as length_limits
from ._simulate import (
    engine_limits as engine_limits,
    requests_from_workload as requests_from_workload,
    simulate as simulate,
    step_function as step_function,
)
from ._speculative import simulate_speculative as simulate_speculative
