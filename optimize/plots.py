"""optimize.plots: the figures of ``optimize``, ``fleet``, ``forecast`` and ``pareto``.

Each ``*_figure`` returns a Matplotlib figure of a command's result, ``*_chart`` / ``save_figure``
/ ``write_pareto_plot`` write one as PNG, and ``NAMES`` gives each figure's file name.  Matplotlib
loads on the first figure, not on import.
"""

from ._pareto_plot import pareto_figure as pareto_figure, write_pareto_plot as write_pareto_plot
from ._plots import (
    NAMES as NAMES,
    fan_chart as fan_chart,
    fan_figure as fan_figure,
    fleet_chart as fleet_chart,
    fleet_figure as fleet_figure,
    latency_figure as latency_figure,
    plot_numbers as plot_numbers,
    save_figure as save_figure,
    tradeoff_figure as tradeoff_figure,
)
