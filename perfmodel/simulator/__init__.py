"""Discrete-event simulator of an iteration-level continuous-batching engine (the referee of the
closed forms in ``perfmodel.dynamics``), using the same ``forward_step`` step time."""

from ._disagg import simulate_disaggregated as simulate_disaggregated
from ._engine import EngineHooks as EngineHooks
from ._engine import EngineLimits as EngineLimits
from ._engine import run_engine as run_engine
from ._features import (
    PrefixCaching as PrefixCaching,
)
from ._features import (
    Speculation as Speculation,
)
from ._features import (
    synthetic_prefix_hashes as synthetic_prefix_hashes,
)
from ._prefix_cache import (
    MOONCAKE_BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS,
)
from ._prefix_cache import (
    BlockPrefixCache as BlockPrefixCache,
)
from ._prefix_cache import (
    replay_reused_tokens as replay_reused_tokens,
)
from ._prefix_cache import (
    replay_trace_reuse as replay_trace_reuse,
)
from ._prefix_cache import (
    shared_prefix_requests as shared_prefix_requests,
)
from ._prefix_cache import (
    simulate_prefix_cache as simulate_prefix_cache,
)
from ._records import SimResult as SimResult
from ._records import kept_requests as kept_requests
from ._records import summarize as summarize
from ._requests import length_limits as length_limits
from ._simulate import (
    engine_limits as engine_limits,
)
from ._simulate import (
    requests_from_workload as requests_from_workload,
)
from ._simulate import (
    simulate as simulate,
)
from ._simulate import (
    step_function as step_function,
)
from ._speculative import simulate_speculative as simulate_speculative
