"""optimize: the cheapest deployment and fleet meeting an SLO with stated confidence."""

from ._evaluate import (
    CONSTRAINTS as CONSTRAINTS,
    cost_per_hour as cost_per_hour,
    meets_confidence as meets_confidence,
    costs_at_min_replicas as costs_at_min_replicas,
    min_replicas as min_replicas,
    slo_probability as slo_probability,
)
from ._exhaustive import GridOptimum as GridOptimum, exhaustive_optimum as exhaustive_optimum
from ._grid import KNOBS as KNOBS, Grid as Grid
from ._metrics import SloMetrics as SloMetrics, Workload as Workload, slo_metrics as slo_metrics
from ._problem import Problem as Problem, make_problem as make_problem
from ._search import SearchOptions as SearchOptions, SearchResult as SearchResult, search as search
