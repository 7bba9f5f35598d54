"""Discrete-event simulator of an iteration-level continuous-batching engine (the referee of the
closed forms in ``perfmodel.dynamics``), using the same ``forward_step`` step time."""

from ._engine import EngineHooks as EngineHooks, EngineLimits as EngineLimits, run_engine as run_engine
from ._records import SimResult as SimResult, summarize as summarize
from ._simulate import (
    engine_limits as engine_limits,
    requests_from_workload as requests_from_workload,
    simulate as simulate,
    step_function as step_function,
)
