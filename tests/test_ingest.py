"""Measurement ingest: every accepted format, every malformed input, skipped rows, real files."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fitting._formats import FLOAT_COLUMNS, INT_COLUMNS, STR_COLUMNS
from fitting.ingest import (
    COLUMNS,
    MeasurementFormatError,
    describe,
    load_measurements,
)

HERE = Path(__file__).parent / "data" / "ingest"
TIDY = HERE / "tidy_example.csv"
VLLM = HERE / "vllm_bench_serve.json"
SGLANG = HERE / "sglang_bench_serving.jsonl"
GENAI = HERE / "profile_export_genai_perf.json"
H100 = {"gpu": "h100-sxm", "tp": 1}


def _rows(table: pd.DataFrame, metric: str, stat: str) -> pd.DataFrame:
    return table[(table.metric == metric) & (table.stat == stat)]


def _assert_schema_dtypes(table: pd.DataFrame) -> None:
    assert tuple(table.columns) == COLUMNS
    for col in INT_COLUMNS:
        assert table[col].dtype == "Int64", col
    for col in FLOAT_COLUMNS:
        assert table[col].dtype == np.float64, col
    for col in STR_COLUMNS:
        assert pd.api.types.is_string_dtype(table[col]) and not table[col].isna().any(), col


# ---------------------------------------------------------------- accepted formats ----------


def test_tidy_csv_keeps_every_row_with_schema_dtypes():
    result = load_measurements(TIDY)
    table = result.table
    assert len(table) == 9 and result.skipped == []
    _assert_schema_dtypes(table)
    assert set(table.scenario) == {
        "prefill",
        "decode_step",
        "static_batch",
        "collective",
        "op",
        "serving",
    }
    prefill = table[table.scenario == "prefill"].iloc[0]
    assert prefill.value == pytest.approx(0.1962532191537321)
    assert (prefill.tp, prefill.batch_size, prefill.input_len) == (2, 1, 512)
    assert pd.isna(prefill.output_len) and prefill.stat == ""
    collective = table[table.scenario == "collective"].iloc[0]
    assert collective.model == "" and collective.message_bytes == 2048  # no model needed


def test_gz_and_csv_give_the_same_table(tmp_path):
    gz = tmp_path / "tidy_example.csv.gz"
    gz.write_bytes(gzip.compress(TIDY.read_bytes()))
    pd.testing.assert_frame_equal(load_measurements(gz).table, load_measurements(TIDY).table)


def test_vllm_save_result_converts_to_serving_rows():
    table = load_measurements(VLLM, **H100).table
    record = json.loads(VLLM.read_text())
    _assert_schema_dtypes(table)
    assert len(table) == 4 * 5 + 2  # ttft/tpot/itl/e2el x mean/median/p50/p90/p99 + 2 rates
    assert set(table.scenario) == {"serving"} and set(table.source) == {"vllm-bench-serve"}
    assert set(table.model) == {"meta-llama/Llama-3.1-8B"} and set(table.engine) == {"vllm"}
    assert set(table.gpu) == {"h100-sxm"} and set(table.num_gpus) == {1}
    assert (table.concurrency == 32).all() and np.isinf(table.request_rate).all()
    assert set(table.input_len) == {1024} and set(table.output_len) == {128}
    ttft = _rows(table, "ttft", "mean").iloc[0]
    assert ttft.value == pytest.approx(record["mean_ttft_ms"] / 1000) and ttft.unit == "s"
    assert "std_s=0.0913307" in ttft.notes
    assert _rows(table, "e2e_latency", "p99").value.iloc[0] == pytest.approx(4.402716302910121)
    rate = _rows(table, "request_throughput", "").iloc[0]
    assert rate.value == pytest.approx(8.085173440146817) and rate.unit == "requests/s"
    assert _rows(table, "output_throughput", "").unit.iloc[0] == "tokens/s"


def test_sglang_jsonl_converts_each_run_and_needs_a_model():
    table = load_measurements(SGLANG, model="meta-llama/Llama-3.1-8B", **H100).table
    assert len(table) == 2 * 15 and set(table.source) == {"sglang-bench-serving"}
    first, second = table[table.request_rate == 4.0], table[np.isinf(table.request_rate)]
    assert len(first) == len(second) == 15
    assert first.concurrency.isna().all() and (second.concurrency == 64).all()
    assert _rows(first, "e2e_latency", "mean").value.iloc[0] == pytest.approx(6.711934095173609)
    assert _rows(second, "itl", "p95").value.iloc[0] == pytest.approx(0.04120394901372492)
    assert "measured_concurrency=26.491" in first.notes.iloc[0]
    assert set(table.input_len) == {1024} and set(table.output_len) == {256}
    # SGLang records no model id: without model= every row is skipped, with its reason
    unknown = load_measurements(SGLANG, **H100)
    assert len(unknown.table) == 0 and len(unknown.skipped) == 30
    _assert_schema_dtypes(unknown.table)
    assert {s.line for s in unknown.skipped} == {1, 2}
    assert all("model is empty" in s.reason for s in unknown.skipped)


def test_genai_perf_export_converts_with_itl_as_tpot():
    table = load_measurements(GENAI, **H100).table
    assert len(table) == 3 * 9 + 2 and set(table.source) == {"genai-perf"}
    assert set(table.metric) == {
        "ttft",
        "tpot",
        "e2e_latency",
        "output_throughput",
        "request_throughput",
    }
    assert set(table.engine) == {"trtllm"} and set(table.model) == {"meta-llama/Llama-3.1-8B"}
    assert (table.concurrency == 8).all() and table.request_rate.isna().all()
    assert set(table.input_len) == {550} and set(table.output_len) == {256}  # 550.03 rounded
    assert _rows(table, "tpot", "mean").value.iloc[0] == pytest.approx(0.0129375521)
    assert _rows(table, "ttft", "p25").value.iloc[0] == pytest.approx(0.0587712004)
    assert _rows(table, "output_throughput", "").value.iloc[0] == pytest.approx(607.1309061642707)
    assert "mean_input_len=550.03" in table.notes.iloc[0]


def test_genai_perf_backend_names_the_engine_only_for_triton(tmp_path):
    record = json.loads(GENAI.read_text())
    record["input_config"] |= {"service_kind": "openai", "endpoint_type": "chat"}
    path = tmp_path / "profile_export_genai_perf.json"
    path.write_text(json.dumps(record))
    assert set(load_measurements(path, **H100).table.engine) == {""}  # backend is only a default
    assert set(load_measurements(path, engine="vllm", **H100).table.engine) == {"vllm"}


def test_a_folder_loads_every_format_and_describe_summarises(tmp_path):
    result = load_measurements(HERE, model="meta-llama/Llama-3.1-8B", **H100)
    assert len(result.files) == 4
    # the model= argument fills only empty CSV cells but sets tool rows
    assert len(result.table) == 9 + 22 + 30 + 29 and result.skipped == []
    text = describe(result)
    assert "90 measurements from 4 file(s); 0 skipped" in text
    assert "serving 83" in text and "genai-perf 29" in text and "h100-sxm" in text


def test_tool_model_argument_replaces_recorded_name_and_keeps_it_in_notes():
    table = load_measurements(VLLM, model="meta-llama/Llama-3.1-70B", **H100).table
    assert set(table.model) == {"meta-llama/Llama-3.1-70B"}
    assert table.notes.str.contains("recorded_model=meta-llama/Llama-3.1-8B").all()


def test_served_model_path_resolves_to_the_catalog_id(tmp_path):
    record = json.loads(VLLM.read_text()) | {"model_id": "/models/meta-llama/Llama-3.1-8B/"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    assert set(load_measurements(path, **H100).table.model) == {"meta-llama/Llama-3.1-8B"}


def test_failed_run_is_skipped_not_dropped(tmp_path):
    record = json.loads(SGLANG.read_text().splitlines()[0]) | {"completed": 0}
    path = tmp_path / "failed.jsonl"
    path.write_text(json.dumps(record) + "\n")
    result = load_measurements(path, model="meta-llama/Llama-3.1-8B", **H100)
    assert len(result.table) == 0
    assert [(s.line, s.reason) for s in result.skipped] == [
        (1, "sglang result with no completed request")
    ]


# ---------------------------------------------------------------- skipped rows --------------


def _edit(tmp_path: Path, line: int, column: str, value: str, name: str = "m.csv") -> Path:
    table = pd.read_csv(TIDY, dtype=str, keep_default_na=False)
    table.loc[line - 2, column] = value
    path = tmp_path / name
    table.to_csv(path, index=False)
    return path


def test_unknown_gpu_and_model_are_skipped_with_file_line_and_reason(tmp_path):
    path = _edit(tmp_path, 3, "gpu", "h100-sxmm")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[4 - 2, "model"] = "acme/NotAModel-7B"
    table.to_csv(path, index=False)
    result = load_measurements(path)
    assert len(result.table) == 7
    (gpu, model) = result.skipped
    assert (gpu.file, gpu.line) == (str(path), 3)
    assert "gpu 'h100-sxmm' is not in the hardware catalog (close: h100-sxm" in gpu.reason
    assert model.line == 4
    assert "model 'acme/NotAModel-7B' is not in the model catalog" in model.reason
    assert "2 x " not in describe(result) and "1 x gpu 'h100-sxmm'" in describe(result)


def test_model_argument_fills_no_model_into_op_or_collective_rows():
    table = load_measurements(TIDY, model="meta-llama/Llama-3.1-8B").table
    assert set(table.model[table.scenario.isin(["op", "collective"])]) == {"", "Qwen/Qwen-72B"}


def test_user_hardware_ids_and_empty_cells_filled_by_arguments(tmp_path):
    path = _edit(tmp_path, 2, "gpu", "my-gpu")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[0, "tp"] = ""
    table.to_csv(path, index=False)
    result = load_measurements(
        path, hardware_ids=["my-gpu", "a100-sxm-80gb", "h100-sxm", "h200-sxm"], tp=4
    )
    assert result.skipped == [] and result.table.gpu.iloc[0] == "my-gpu"
    assert result.table.tp.iloc[0] == 4 and result.table.tp.iloc[1] == 2  # fills only the gap


def test_gpu_argument_stands_in_for_a_missing_gpu_column(tmp_path):
    table = pd.read_csv(TIDY, dtype=str, keep_default_na=False).drop(columns=["gpu", "source"])
    table.to_csv(tmp_path / "mine.csv", index=False)
    result = load_measurements(tmp_path / "mine.csv", gpu="h200-sxm")
    assert len(result.table) == 9 and set(result.table.gpu) == {"h200-sxm"}
    assert set(result.table.source) == {"mine"}  # a file without sources is named after itself


def test_model_alias_and_config_path_are_accepted(tmp_path):
    config = tmp_path / "tiny.json"
    shutil.copy(
        Path(__file__).parents[1] / "data" / "models" / "meta-llama--Llama-2-7b-hf.json", config
    )
    path = _edit(tmp_path, 2, "model", "llama-2-70b-hf")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[1, "model"] = str(config)
    table.to_csv(path, index=False)
    result = load_measurements(path)
    assert result.skipped == []
    assert list(result.table.model[:2]) == ["meta-llama/Llama-2-70b-hf", str(config)]


# ---------------------------------------------------------------- malformed input -----------


@pytest.mark.parametrize(
    ("line", "column", "value", "message"),
    [
        (3, "scenario", "warmup", ":3: column 'scenario' = 'warmup' is not a scenario; use one"),
        (4, "value", "abc", ":4: column 'value' = 'abc' is not a number"),
        (2, "value", "", ":2: column 'value' = '' is empty"),
        (5, "value", "-0.5", ":5: column 'value' = '-0.5' must be a positive number"),
        (6, "unit", "min", ":6: column 'unit' = 'min' is not a unit; use one of s, tokens/s"),
        (2, "metric", "ttft", ":2: column 'metric' = 'ttft' is not a metric of scenario 'prefill'"),
        (7, "batch_size", "1.5", ":7: column 'batch_size' = '1.5' is not a whole number"),
        (3, "tp", "two", ":3: column 'tp' = 'two' is not a number"),
        (8, "stat", "typical", ":8: column 'stat' = 'typical' is not a statistic"),
        (9, "kv_dtype", "fp9", ":9: column 'kv_dtype' = 'fp9' is not a dtype"),
    ],
)
def test_malformed_csv_names_file_line_and_field(tmp_path, line, column, value, message):
    path = _edit(tmp_path, line, column, value)
    with pytest.raises(MeasurementFormatError) as err:
        load_measurements(path)
    assert str(err.value).startswith(str(path) + message)


def test_metric_unit_mismatch_names_the_unit_to_use(tmp_path):
    path = _edit(tmp_path, 2, "unit", "tokens/s")
    with pytest.raises(
        MeasurementFormatError,
        match=r"m.csv:2: column 'unit' = 'tokens/s' does "
        r"not fit metric 'time'; write it in s",
    ):
        load_measurements(path)


def test_missing_and_unknown_columns_name_the_header(tmp_path):
    table = pd.read_csv(TIDY, dtype=str, keep_default_na=False)
    table.drop(columns="unit").to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(MeasurementFormatError, match=r"a.csv:1: missing required column 'unit'"):
        load_measurements(tmp_path / "a.csv")
    table.rename(columns={"input_len": "isl"}).to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(MeasurementFormatError, match=r"b.csv:1: column 'isl' is not in the"):
        load_measurements(tmp_path / "b.csv")
    with pytest.raises(MeasurementFormatError, match="no such file"):
        load_measurements(tmp_path / "missing.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MeasurementFormatError, match="no measurement files in"):
        load_measurements(tmp_path / "empty")


@pytest.mark.parametrize(
    ("source", "edit", "message"),
    [
        (
            VLLM,
            lambda r: r | {"mean_ttft_ms": "fast"},
            ":1: key 'mean_ttft_ms' = 'fast' is not a number",
        ),
        (
            GENAI,
            lambda r: r | {"time_to_first_token": r["time_to_first_token"] | {"unit": "min"}},
            ":1: time_to_first_token.unit = 'min' is not a known time unit",
        ),
        (
            GENAI,
            lambda r: r | {"request_latency": r["request_latency"] | {"p99": "n/a"}},
            ":1: key 'request_latency.p99' = 'n/a' is not a number",
        ),
        (VLLM, lambda r: {"hello": "world"}, ":1: not a known benchmark result"),
    ],
)
def test_malformed_tool_output_names_file_line_and_key(tmp_path, source, edit, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(edit(json.loads(source.read_text()))))
    with pytest.raises(MeasurementFormatError) as err:
        load_measurements(path, **H100)
    assert str(err.value).startswith(str(path) + message)


def test_broken_jsonl_line_is_named(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(SGLANG.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(MeasurementFormatError, match=r"runs.jsonl:2: not valid JSON"):
        load_measurements(path, **H100)


# ---------------------------------------------------------------- the bundled measurements --


README_ROWS = {
    "vidur_ops.csv.gz": 200_127,
    "vidur_collectives.csv.gz": 26_364,
    "aic_kernels_h100.csv.gz": 220_826,
    "aic_kernels_a100.csv.gz": 20_770,
    "splitwise.csv": 2_520,
    "aic_serving_h100.csv": 1_620,
    "trtllm_docs.csv": 201,
    "inferencemax_nvidia.csv.gz": 11_713,
    "mlperf_v41.csv.gz": 2_181,
}
"""Row counts stated in the data README."""


@pytest.fixture(scope="module")
def bundled(bundled_ingest):
    return bundled_ingest


def test_bundled_measurements_load_completely(bundled):
    assert sorted(Path(f).name for f in bundled.files) == sorted(README_ROWS)
    assert bundled.skipped == [] and len(bundled.table) == sum(README_ROWS.values())
    _assert_schema_dtypes(bundled.table)
    by_source = bundled.table.source.value_counts()
    assert by_source["splitwise"] == 2_520
    assert by_source["trtllm-docs-v0.6.1"] + by_source["trtllm-docs-v0.9"] == 201
    assert by_source["aiconfigurator-silicon"] == 1_620
    assert by_source["vidur"] == 200_127 + 26_364
    assert by_source["aiconfigurator"] == 220_826 + 20_770
    assert by_source["inferencemax"] == 11_713
    assert by_source["mlperf-inference-v4.1"] == 2_181
    splitwise = bundled.table[bundled.table.source == "splitwise"]
    assert (splitwise.scenario.value_counts() == 1_260).all()
    assert (bundled.table.value > 0).all() and np.isfinite(bundled.table.value).all()


def test_describe_reports_scenarios_gpus_and_sources(bundled):
    text = describe(bundled)
    assert text.splitlines()[0] == "486,322 measurements from 9 file(s); 0 skipped"
    assert "op 440,439" in text and "collective 27,648" in text and "static_batch 201" in text
    assert "serving 15,334" in text and "saturated 180" in text
    assert "by gpu: h100-sxm 286,495" in text and "splitwise 2,520" in text


def test_scheduler_recv_interval_fills_the_notes_and_the_cli_passes_it(tmp_path, capsys):
    """``scheduler_recv_interval=`` (``--scheduler-recv-interval``) joins the notes of every row
    of a tool's result file beside the stream interval, and the TTFT rows read it; ``validate``
    passes the flag through (its rows then carry it)."""
    from fitting._rows import scheduler_poll_iterations

    table = load_measurements(
        VLLM, engine="sglang", stream_interval=10, scheduler_recv_interval=30, **H100
    ).table
    assert table.notes.str.count("scheduler_recv_interval=30").eq(1).all()
    ttft = table[table.metric == "ttft"]
    assert len(ttft) and all(scheduler_poll_iterations(r) == 30.0 for _, r in ttft.iterrows())
    assert not load_measurements(VLLM, **H100).table.notes.str.contains("scheduler_recv").any()
    from servingmath.cli import main

    argv = ["validate", "--data", str(VLLM), "--gpu", "h100-sxm", "--engine", "sglang"]
    assert main([*argv, "--scheduler-recv-interval", "0"]) == 2
    assert "--scheduler-recv-interval" in capsys.readouterr().err


def test_stream_interval_fills_the_notes_of_runs_that_do_not_say(tmp_path):
    """``stream_interval=`` (``--stream-interval``) joins the notes of every row of a tool's
    result file, which never records the server's setting; a tidy row that says its own keeps
    it; the ITL row then reads it."""
    from fitting._rows import stream_chunk_tokens

    table = load_measurements(VLLM, engine="vllm", stream_interval=10, **H100).table
    itl = table[table.metric == "itl"]
    assert len(itl) and all(stream_chunk_tokens(r) == 10.0 for _, r in itl.iterrows())
    assert table.notes.str.count("stream_interval=").eq(1).all()
    tidy = pd.read_csv(TIDY)
    tidy["notes"] = tidy["notes"].fillna("").astype(str) + ";stream_interval=4"
    path = tmp_path / "tidy.csv"
    tidy.to_csv(path, index=False)
    kept = load_measurements(path, stream_interval=10).table
    assert kept.notes.str.contains("stream_interval=4").all()
    assert not kept.notes.str.contains("stream_interval=10").any()
    assert not load_measurements(VLLM, **H100).table.notes.str.contains("stream_interval").any()


def test_a_fine_tuned_or_quantized_checkpoint_reads_as_its_base_model(tmp_path):
    """Benchmarks name the checkpoint they served: a chat fine-tune keeps the row's fp16; a
    pre-quantized FP8 checkpoint with no weight dtype recorded takes fp8 from its name."""
    path = _edit(tmp_path, 2, "model", "meta-llama/Llama-2-70b-chat-hf")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[9 - 2, "model"] = "RedHatAI/Qwen3-32B-FP8-dynamic"
    table.to_csv(path, index=False)
    result = load_measurements(path)
    assert result.skipped == []
    first, quantized, plain = result.table.iloc[0], result.table.iloc[7], result.table.iloc[8]
    assert (first.model, first.weight_dtype) == ("meta-llama/Llama-2-70b-hf", "fp16")
    assert (quantized.model, quantized.weight_dtype) == ("Qwen/Qwen3-32B", "fp8")
    assert (plain.model, plain.weight_dtype) == ("Qwen/Qwen3-32B", "")


def test_a_bench_serve_run_of_an_instruct_checkpoint_is_read(tmp_path):
    record = json.loads(VLLM.read_text()) | {"model_id": "meta-llama/Meta-Llama-3.1-8B-Instruct"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    result = load_measurements(path, **H100)
    assert result.skipped == [] and set(result.table.model) == {"meta-llama/Llama-3.1-8B"}


def test_a_gpu_named_as_nvidia_smi_prints_it_is_read(tmp_path):
    path = _edit(tmp_path, 4, "gpu", "NVIDIA H100 80GB HBM3")
    result = load_measurements(path)
    assert result.skipped == [] and result.table.gpu.iloc[2] == "h100-sxm"


@pytest.mark.parametrize(
    "spelled, engine",
    [("TensorRT-LLM", "trtllm"), ("trt_llm", "trtllm"), ("vLLM", "vllm"), ("SGLang", "sglang")],
)
def test_an_engine_spelled_as_its_project_does_is_its_id(tmp_path, spelled, engine):
    """Rows of one engine share its fitted offsets however a lab spells its name."""
    path = _edit(tmp_path, 4, "engine", spelled)
    assert load_measurements(path).table.engine.iloc[2] == engine


def test_a_time_in_milliseconds_is_read_in_seconds(tmp_path):
    """A unit that says exactly what it is (``ms``, ``tokens/sec``) is converted to the schema's:
    840.8 ms of TTFT is the 0.8408 s of the same row written in seconds; a collective's time
    and its spread (43 us +- 19.5 us) scale together."""
    reference = load_measurements(TIDY).table
    path = _edit(tmp_path, 9, "unit", "ms")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[9 - 2, "value"] = "840.8064807531249"
    table.loc[6 - 2, ["value", "unit", "value_std"]] = ["43", "us", "19.48218559493661"]
    table.loc[4 - 2, "unit"] = "tokens/sec"
    table.to_csv(path, index=False)
    read = load_measurements(path).table
    assert list(read.unit) == list(reference.unit)
    np.testing.assert_allclose(read.value, reference.value, rtol=1e-12)
    np.testing.assert_allclose(read.value_std, reference.value_std, rtol=1e-12)


def test_an_average_is_a_mean(tmp_path):
    path = _edit(tmp_path, 3, "stat", "avg")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[7 - 2, "stat"] = "Average"  # not an alias in this case: refused below
    table.to_csv(path, index=False)
    with pytest.raises(MeasurementFormatError, match="'Average' is not a statistic"):
        load_measurements(path)
    table.loc[7 - 2, "stat"] = "average"
    table.to_csv(path, index=False)
    read = load_measurements(path).table
    assert list(read.stat) == list(load_measurements(TIDY).table.stat)


def test_a_file_written_with_a_labs_names_reads_as_the_catalog_named_one(tmp_path):
    """The example file with every GPU as ``nvidia-smi`` prints it, every model as a served
    checkpoint and every engine as its project spells it reads as the same table."""
    table = pd.read_csv(TIDY, dtype=str, keep_default_na=False)
    gpus = {
        "a100-sxm-80gb": "NVIDIA A100-SXM4-80GB",
        "h100-sxm": "NVIDIA H100 80GB HBM3",
        "h200-sxm": "NVIDIA H200",
    }
    models = {
        "meta-llama/Llama-2-70b-hf": "meta-llama/Llama-2-70b-chat-hf",
        "EleutherAI/gpt-j-6b": "EleutherAI/gpt-j-6b",
        "mistralai/Mixtral-8x7B-v0.1": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "Qwen/Qwen-72B": "Qwen/Qwen-72B-Chat",
        "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
        "": "",
    }
    engines = {"trtllm": "TensorRT-LLM", "vllm": "vLLM", "sglang": "SGLang"}
    table["gpu"] = table["gpu"].map(gpus)
    table["model"] = table["model"].map(models)
    table["engine"] = table["engine"].map(lambda e: engines.get(e, e))
    table.to_csv(tmp_path / "lab.csv", index=False)
    read = load_measurements(tmp_path / "lab.csv")
    assert read.skipped == []
    pd.testing.assert_frame_equal(
        read.table.drop(columns="source"), load_measurements(TIDY).table.drop(columns="source")
    )
