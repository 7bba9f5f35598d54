"""Measurement ingest: tidy CSVs and benchmark-tool outputs into one validated table."""

from ._formats import (
    COLUMNS as COLUMNS,
    METRIC_UNIT as METRIC_UNIT,
    SCENARIO_METRICS as SCENARIO_METRICS,
    UNITS as UNITS,
)
from ._ingest import (
    IngestResult as IngestResult,
    MeasurementFormatError as MeasurementFormatError,
    SkippedRow as SkippedRow,
    bundled_measurements as bundled_measurements,
    describe as describe,
    load_measurements as load_measurements,
)
