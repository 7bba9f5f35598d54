"""fitting: calibrate perfmodel's budgets on real measurements (NumPyro), with intervals.

``load_posterior`` / ``efficiency_draws`` give per-GPU ``perfmodel.Efficiency`` draws from the
bundled (or a user's) posterior; ``prepare`` / ``predict_log`` map measurement rows to
predictions; ``fit_table`` refits; ``validate`` scores a posterior on held-out measurements.
"""

from ._diagnostics import Diagnostics as Diagnostics, diagnose as diagnose
from ._fit import (
    FitResult as FitResult,
    fit_table as fit_table,
    read_tables as read_tables,
    subsample as subsample,
)
from ._model import PRIORS as PRIORS, calibration_model as calibration_model
from ._plots import write_plots as write_plots
from ._posterior import (
    Posterior as Posterior,
    PosteriorError as PosteriorError,
    default_posterior_path as default_posterior_path,
    efficiency_draws as efficiency_draws,
    kernel_efficiency_draws as kernel_efficiency_draws,
    load_posterior as load_posterior,
    save_posterior as save_posterior,
)
from ._predict import predict_log as predict_log
from ._predictive import predictive_log_draws as predictive_log_draws
from ._rows import Prepared as Prepared, prepare as prepare
from ._update import (
    update_posterior as update_posterior,
    user_hardware as user_hardware,
    without_gpu as without_gpu,
)
from ._update_report import UpdateReport as UpdateReport, update_report as update_report
from ._validate import (
    format_report as format_report,
    score_draws as score_draws,
    validate as validate,
)
from .ingest import (
    IngestResult as IngestResult,
    MeasurementFormatError as MeasurementFormatError,
    SkippedRow as SkippedRow,
    bundled_measurements as bundled_measurements,
    describe as describe,
    load_measurements as load_measurements,
)
