"""Catalog loaders: ids, aliases, user files through the same path, and clear errors."""

import csv
import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st

import perfmodel as pm


def test_hardware_row_units():
    h100 = pm.load_hardware("h100-sxm")
    assert float(h100.hbm_bytes) == 80 * 2**30
    assert float(h100.hbm_bytes_per_s) == 3.35e12
    assert float(h100.dense_flops_per_s[0]) == 989e12
    assert float(h100.link_bytes_per_s) == 450e9
    assert float(h100.price_per_gpu_hour) > 0


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm-80gb", "h200-sxm", "b200", "l40s", "mi300x"])
def test_issue_named_gpus_load(gpu):
    hw = pm.load_hardware(gpu)
    assert float(hw.hbm_bytes) > 0 and float(hw.dense_flops_per_s[0]) > 0


def test_alias_and_id_and_config_path_agree():
    by_id = pm.load_model("meta-llama/Llama-3.1-70B")
    by_alias = pm.load_model("llama-3.1-70b")
    by_path = pm.load_model(str(pm.data_dir() / "models" / "meta-llama--Llama-3.1-70B.json"))
    for field in ("num_layers", "total_params", "num_kv_heads"):
        assert (
            float(getattr(by_id, field))
            == float(getattr(by_alias, field))
            == float(getattr(by_path, field))
        )


@pytest.mark.parametrize(
    "model_id", ["bigscience/bloom", "EleutherAI/gpt-j-6b", "tiiuae/falcon-180B", "Qwen/Qwen-72B"]
)
def test_models_without_config_load_from_dimension_row(model_id):
    model = pm.load_model(model_id)
    assert float(model.total_params) > 5e9


def test_bloom_size_from_dimensions():
    assert float(pm.load_model("bigscience/bloom").total_params) / 1e9 == pytest.approx(
        176.2, rel=0.01
    )


def test_unknown_names_list_close_matches():
    with pytest.raises(pm.CatalogError, match="close matches: .*h100-sxm"):
        pm.load_hardware("h100-sxn")  # a misspelt form is no form: the chip "h100sxn" is unknown
    with pytest.raises(pm.CatalogError, match="close matches: .*Llama-3.1-8B"):
        pm.load_model("llama-3.1-8")


def test_user_hardware_csv_same_code_path(tmp_path):
    with open(pm.data_dir() / "hardware.csv") as fh:
        rows = list(csv.DictReader(fh))
    row = dict(
        next(r for r in rows if r["id"] == "h100-sxm"), id="my-gpu", hbm_bytes=str(96 * 2**30)
    )
    path = tmp_path / "hw.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    hw = pm.load_hardware("my-gpu", hardware_csv=path)
    assert float(hw.hbm_bytes) == 96 * 2**30
    row["hbm_bytes_per_s"] = "fast"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    pm._catalog._hardware_rows.cache_clear()
    with pytest.raises(pm.CatalogError, match="hbm_bytes_per_s.*not a number"):
        pm.load_hardware("my-gpu", hardware_csv=path)


def test_malformed_config_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(pm.CatalogError, match="not valid JSON"):
        pm.load_model(str(bad))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    with pytest.raises(pm.CatalogError, match="lacks key 'num_hidden_layers'"):
        pm.load_model(str(partial))


def test_every_catalog_model_loads():
    for model_id in pm.model_ids():
        assert float(pm.load_model(model_id).total_params) > 1e9, model_id


def test_llama_3_3_70b_row_has_the_published_70b_dimensions():
    """The row without a config.json (80 layers, d = 8192, 64 heads, 8 KV heads, gated MLP
    28672 wide, vocabulary 128256, untied embeddings) gives, by hand: per layer q and o
    8192^2 each, k and v 8192 x 1024 each, MLP 3 x 8192 x 28672, two norms 8192 each, so
    855,654,400; x 80 plus two 128256 x 8192 embeddings and the final norm = 70,553,706,496,
    the count Llama-3.1-70B's config.json gives; KV 2 x 80 x 8 x 128 x 2 B = 327,680 B/token."""
    row_model = pm.load_model("meta-llama/Llama-3.3-70B-Instruct")
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert float(row_model.total_params) == 80 * per_layer + 2 * 128256 * 8192 + 8192
    assert float(row_model.total_params) == float(
        pm.load_model("meta-llama/Llama-3.1-70B").total_params
    )
    assert float(pm.kv_bytes_per_token(row_model, 2.0)) == 327_680.0


# ---------------------------------------------------------------- current catalog: new rows --------

NEW_GPUS = ["mi350x", "mi355x", "h200-nvl", "gh200-144gb"]


@pytest.mark.parametrize("gpu", [*NEW_GPUS, "h100-nvl"])
def test_current_accelerators_load_with_finite_specs(gpu):
    import math

    hw = pm.load_hardware(gpu)
    for value in (hw.hbm_bytes, hw.hbm_bytes_per_s, hw.dense_flops_per_s[0], hw.link_bytes_per_s):
        assert math.isfinite(float(value)) and float(value) > 0, gpu


def test_h100_nvl_is_now_predictable():
    hw = pm.load_hardware("h100-nvl")
    # NVIDIA H100 NVL datasheet / nvidia.com/en-us/data-center/h100 spec table: BF16 Tensor Core
    # 1,671 TFLOPS with sparsity -> 835.5 dense; NVLink bridge 600 GB/s bidirectional -> 300 one way.
    assert float(hw.dense_flops_per_s[0]) == pytest.approx(835.5e12)
    assert float(hw.link_bytes_per_s) == pytest.approx(300e9)


@pytest.mark.parametrize(
    "gpu, bf16",
    [
        # AMD MI355X spec page (amd.com/en/products/accelerators/instinct/mi350/mi355x.html, via
        # stas00/ml-engineering compute/accelerator/README.md note 22): 2.5 PFLOPS dense FP16/BF16.
        ("mi355x", 2.5e15),
        # AMD MI350X: 2.3 PFLOPS dense (8-GPU platform 18.5 PF / 8; MI355X x 2200/2400 MHz).
        ("mi350x", 2.3e15),
        # nvidia.com/en-us/data-center/h200 spec table, H200 NVL column: 1,671 TFLOPS with sparsity.
        ("h200-nvl", 835.5e12),
        # stas00/ml-engineering TFLOPS table, NVIDIA GH200 SXM: 989 TFLOPS (same GPU as H100 SXM).
        ("gh200-144gb", 989e12),
    ],
)
def test_new_rows_bf16_equals_datasheet(gpu, bf16):
    assert float(pm.load_hardware(gpu).dense_flops_per_s[0]) == pytest.approx(bf16)


def test_gh200_rows_are_the_two_memory_variants():
    assert float(pm.load_hardware("gh200").hbm_bytes) == 96 * 2**30
    assert float(pm.load_hardware("gh200-144gb").hbm_bytes) == 144 * 2**30


def test_no_row_quotes_a_sparse_fp8_rate():
    """Dense FP8 is 2x dense BF16 on every part here; a 4x ratio means a 2:4-sparsity figure crept in.

    The slack covers vendors' own rounding: NVIDIA lists L40S at 362.05 / 733 TFLOPS (ratio 2.025).
    """
    with open(pm.data_dir() / "hardware.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    checked = 0
    for row in rows:
        bf16, fp8 = row["dense_bf16_flops_per_s"], row["dense_fp8_flops_per_s"]
        if bf16 and fp8:
            assert float(fp8) <= 2.05 * float(bf16), row["id"]
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize(
    "gpu, dtype, expected",
    [
        ("h100-sxm", "fp4", 989e12),  # no FP4 units: weight-only 4-bit runs 16-bit math
        ("h200-sxm", "fp4", 989e12),
        ("a100-sxm-80gb", "fp8", 312e12),  # no FP8 units: dequantised to bf16
        ("b200", "fp4", 9000e12),  # its own FP4 rate
        ("h100-sxm", "fp8", 1979e12),
    ],
)
def test_missing_rate_is_the_weight_only_kernels(gpu, dtype, expected):
    hw = pm.load_hardware(gpu)
    dep = pm.Deployment.create(weight_dtype=dtype)
    assert float(pm.peak_flops_per_s(hw, dep)) == pytest.approx(expected, rel=1e-3)


# ---------------------------------------------------------------- checkpoint ids --------------


@pytest.mark.parametrize(
    "name, catalog_id",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B"),
        ("meta-llama/Llama-2-70b-chat-hf", "meta-llama/Llama-2-70b-hf"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "mistralai/Mistral-7B-v0.1"),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1"),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B"),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "meta-llama/Llama-3.3-70B-Instruct"),
        ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "meta-llama/Llama-3.1-70B"),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "meta-llama/Llama-3.1-8B"),
        ("qwen/qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B"),
        ("/models/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("llama2-70b", "meta-llama/Llama-2-70b-hf"),  # MLPerf's spelling: no separator
        ("Qwen/Qwen2-72B-Instruct", "Qwen/Qwen2-72B-Instruct"),  # its own row comes first
    ],
)
def test_a_checkpoint_id_reads_as_its_catalog_architecture(name, catalog_id):
    assert pm.load_model(name).name == catalog_id


@pytest.mark.parametrize(
    "name",
    [
        "mistralai/Mistral-7B-Instruct-v0.3",  # v0.3: another vocabulary than v0.1
        "openai/gpt-oss-20b",  # another size than the 120b row
        "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.2-11B-Vision-Instruct",
    ],
)
def test_another_version_or_size_is_not_read_as_a_neighbour(name):
    with pytest.raises(pm.CatalogError, match="unknown model"):
        pm.load_model(name)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "fp8"),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "fp8"),
        ("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "int4"),
        ("TheBloke/Llama-2-70B-Chat-GPTQ", "int4"),
        ("nvidia/Llama-3.3-70B-Instruct-FP4", "fp4"),
        ("nvidia/DeepSeek-V3.1-NVFP4", "fp4"),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "int8"),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("fp8/Llama-3.1-8B", None),  # an organisation is not a tag
    ],
)
def test_a_checkpoint_name_states_its_weight_dtype(name, dtype):
    assert pm.checkpoint_weight_dtype(name) == dtype


@pytest.mark.parametrize(
    "requested, served",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("/models/Llama-3.1-8B", "/models/Llama-3.1-8B"),
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),  # an alias serves the catalog id
        ("META-LLAMA/llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("/tmp/config.json", "meta-llama/Llama-3.1-8B"),
    ],
)
def test_engines_serve_the_checkpoint_the_user_named(requested, served):
    assert pm.served_model_id(requested, "meta-llama/Llama-3.1-8B") == served


_TAGS = st.sampled_from(["Instruct", "chat", "hf", "it", "FP8", "dynamic", "AWQ", "INT4", "0528"])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(pm.model_ids()), st.lists(_TAGS, min_size=1, max_size=3), st.booleans())
def test_tags_never_change_the_architecture_read(model_id, tags, lower):
    """Any fine-tune / quantisation / date tags after a catalog id, under another organisation
    and in any case, read as a catalog model with the same dimensions."""
    name = "someone/" + model_id.split("/")[-1] + "-" + "-".join(tags)
    base, read = pm.load_model(model_id), pm.load_model(name.lower() if lower else name)
    for field in dataclasses.fields(base):
        if field.name != "name":
            assert float(getattr(read, field.name)) == float(getattr(base, field.name)), field


# ---------------------------------------------------------------- GPU names -------------------


@pytest.mark.parametrize(
    "name, gpu_id",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # nvidia-smi's SXM H100: no form in the name
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("H100-SXM5-80GB", "h100-sxm"),
        ("H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("A100 80GB", "a100-sxm-80gb"),
        ("AMD Instinct MI300X OAM", "mi300x"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GH200", "gh200"),
        ("GH200 144GB HBM3e", "gh200-144gb"),
        ("Google TPU v6e", "tpu-v6e"),
    ],
)
def test_a_gpu_named_as_nvidia_smi_or_its_vendor_does_is_its_catalog_part(name, gpu_id):
    assert pm.load_hardware(name).name == gpu_id


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("A100", "could be any of a100-sxm-40gb, a100-sxm-80gb; pass one"),  # SXM: no form
        ("NVIDIA A100-PCIE-40GB", "unknown GPU"),  # no 40 GB PCIe row: not the 80 GB one
        ("NVIDIA GH200 480GB", "unknown GPU"),  # 480 GB is the module, neither HBM size
        ("H800", "unknown GPU"),
        ("Tesla T4", "unknown GPU"),
    ],
)
def test_a_gpu_name_that_fits_no_part_or_several_is_refused(name, fragment):
    with pytest.raises(pm.CatalogError, match=fragment):
        pm.load_hardware(name)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(pm.hardware_ids()), st.sampled_from(["NVIDIA ", "AMD ", ""]), st.booleans())
def test_every_catalog_id_spelled_another_way_reads_as_itself(gpu_id, vendor, underscores):
    spelled = vendor + gpu_id.upper().replace("-", "_" if underscores else " ")
    assert pm.resolve_gpu_id(spelled, pm.hardware_capacities()) == gpu_id
