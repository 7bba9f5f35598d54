"""fitting: calibrate perfmodel's budgets on real measurements (NumPyro), with intervals.

``load_posterior`` / ``efficiency_draws`` give per-GPU ``perfmodel.Efficiency`` draws from the
bundled (or a user's) posterior; ``prepare`` / ``predict_log`` map measurement rows to
predictions; ``fit_table`` refits; ``validate`` scores a posterior on held-out measurements.

Names load on first use (PEP 562): drawing efficiencies from a posterior needs NumPy alone, and
NumPyro, pandas, ArviZ and Matplotlib (~2 s of imports on two cores) load only with the parts
that use them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "._diagnostics": ("Diagnostics", "diagnose"),
    "._fit": ("FitResult", "fit_table", "read_tables", "skipped_summary", "subsample"),
    "._groups": ("lockstep", "noise_key", "notes_dict"),
    "._holdout": ("holdout_scores", "score_rows"),
    "._model": ("PRIORS", "calibration_model"),
    "._names": ("E2E_SCENARIOS", "ENGINE_ALL_REDUCE_CELL", "PARAM_NAMES"),
    "._plots": ("write_plots",),
    "._posterior": (
        "Posterior",
        "PosteriorError",
        "default_posterior_path",
        "draw_indices",
        "efficiency_draws",
        "kernel_efficiency_draws",
        "load_posterior",
        "parameter_draws",
        "save_posterior",
    ),
    "._predict": ("predict_log",),
    "._predictive": ("predictive_log_draws",),
    "._rows": ("Prepared", "prepare"),
    "._serving_stage": ("add_serving_stage", "without_serving_stage"),
    "._update": (
        "MAX_SERVING_ROWS",
        "MAX_TREE_DEPTH",
        "run_labels",
        "update_posterior",
        "user_hardware",
        "without_gpu",
    ),
    "._update_report": ("UpdateReport", "update_report"),
    "._validate": ("format_report", "predictive_quantiles", "score_draws", "validate"),
    ".ingest": (
        "IngestResult",
        "MeasurementFormatError",
        "SkippedRow",
        "bundled_measurements",
        "describe",
        "load_measurements",
    ),
}
_RENAMED = {  # public name: (module, its name there)
    # a serving or saturated measurement row -> ((model, hardware, deployment), workload numbers)
    "serving_row_specs": ("._rows", "_e2e_features"),
    # why the fit skips a measurement row (flagged, power-capped, duplicate ...), or None
    "row_skip_reason": ("._rows", "_skip_reason"),
    # posterior draws whose per-field median gives a GPU's parameters in the cut (serving) stage
    "MEDIAN_PARAM_DRAWS": ("._serving_stage", "PARAM_DRAWS"),
    # end-to-end rows the cut stage uses per (source, engine, gpu, metric) cell
    "SERVING_ROWS_PER_CELL": ("._serving_stage", "PER_CELL"),
}
_WHERE = {name: (module, name) for module, names in _EXPORTS.items() for name in names}
_WHERE.update(_RENAMED)


def __getattr__(name: str):
    module, attribute = _WHERE.get(name, (None, None))
    if module is None:  # a submodule (``fitting._update``) reached as an attribute
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
