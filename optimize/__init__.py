"""optimize: the cheapest deployment and fleet meeting an SLO with stated confidence."""

from ._classes import (
    RequestClass as RequestClass,
    classes_from_trace as classes_from_trace,
    fleet_problem as fleet_problem,
    replica_capacity as replica_capacity,
)
from ._describe import describe_config as describe_config
from ._draws import efficiency_draws_for as efficiency_draws_for
from ._engine_args import ENGINES as ENGINES, flag_table as flag_table
from ._evaluate import (
    CONSTRAINTS as CONSTRAINTS,
    constraint_slacks as constraint_slacks,
    constraints_hold as constraints_hold,
    cost_per_hour as cost_per_hour,
    costs_at_min_replicas as costs_at_min_replicas,
    draw_metrics as draw_metrics,
    meets_confidence as meets_confidence,
    min_replicas as min_replicas,
    slo_probability as slo_probability,
)
from ._exhaustive import (
    GridOptimum as GridOptimum,
    exhaustive_costs as exhaustive_costs,
    exhaustive_optimum as exhaustive_optimum,
)
from ._fleet import (
    FleetPlan as FleetPlan,
    FleetProblem as FleetProblem,
    fleet_gradient as fleet_gradient,
    fleet_milp as fleet_milp,
    plan_cost as plan_cost,
)
from ._forecast import (
    DemandError as DemandError,
    cheapest_per_gpu as cheapest_per_gpu,
    forecast_gpus as forecast_gpus,
    read_demand as read_demand,
)
from ._grid import (
    KNOBS as KNOBS,
    MOE_LAYOUTS as MOE_LAYOUTS,
    Grid as Grid,
    one_hot_weights as one_hot_weights,
)
from ._metrics import (
    SloMetrics as SloMetrics,
    Workload as Workload,
    serving_slo_metrics as serving_slo_metrics,
    slo_metrics as slo_metrics,
)
from ._pareto import (
    DEFAULT_CONCURRENCIES as DEFAULT_CONCURRENCIES,
    check_fits as check_fits,
    pareto_frontier as pareto_frontier,
    pareto_grid as pareto_grid,
    pareto_problem as pareto_problem,
)
from ._pareto_points import (
    ParetoPoint as ParetoPoint,
    ParetoResult as ParetoResult,
    ParetoSweep as ParetoSweep,
    non_dominated as non_dominated,
)
from ._problem import (
    Problem as Problem,
    make_problem as make_problem,
    require_peak_capacity as require_peak_capacity,
)
from ._program_cache import cached_jit as cached_jit
from ._recommend import Recommendation as Recommendation, recommend as recommend
from ._search import SearchOptions as SearchOptions, SearchResult as SearchResult, search as search
from ._sharding import device_mesh as device_mesh, shard_draws as shard_draws
from ._simcheck import simulate_check as simulate_check
from ._verify import (
    colocated_verdict_metrics as colocated_verdict_metrics,
    verdict_engine as verdict_engine,
)
from .plots import fan_chart as fan_chart
