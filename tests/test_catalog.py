"""Catalog loaders: ids, aliases, user files through the same path, and clear errors."""

import csv
import json

import pytest

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
        assert float(getattr(by_id, field)) == float(getattr(by_alias, field)) == float(getattr(by_path, field))


@pytest.mark.parametrize("model_id", ["bigscience/bloom", "EleutherAI/gpt-j-6b", "tiiuae/falcon-180B", "Qwen/Qwen-72B"])
def test_models_without_config_load_from_dimension_row(model_id):
    model = pm.load_model(model_id)
    assert float(model.total_params) > 5e9


def test_bloom_size_from_dimensions():
    assert float(pm.load_model("bigscience/bloom").total_params) / 1e9 == pytest.approx(176.2, rel=0.01)


def test_unknown_names_list_close_matches():
    with pytest.raises(pm.CatalogError, match="close matches: .*h100-sxm"):
        pm.load_hardware("h100")
    with pytest.raises(pm.CatalogError, match="close matches: .*Llama-3.1-8B"):
        pm.load_model("llama-3.1-8")


def test_user_hardware_csv_same_code_path(tmp_path):
    with open(pm.data_dir() / "hardware.csv") as fh:
        rows = list(csv.DictReader(fh))
    row = dict(next(r for r in rows if r["id"] == "h100-sxm"), id="my-gpu", hbm_bytes=str(96 * 2**30))
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
        if model_id == "meta-llama/Llama-3.3-70B-Instruct":  # catalog row with all values empty
            with pytest.raises(pm.CatalogError, match="lacks dimensions"):
                pm.load_model(model_id)
            continue
        assert float(pm.load_model(model_id).total_params) > 1e9, model_id
