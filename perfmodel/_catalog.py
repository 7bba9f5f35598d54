"""Load catalogs (``data/``) into spec pytrees: hardware rows, prices, ``config.json`` files.

The only I/O in ``perfmodel``.  A user's own file goes through the same code path as a bundled
one (STYLE §7).  Bad input raises ``CatalogError`` whose message names the problem and the fix.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from ._constants import COMPUTE_DTYPES, GB
from ._gpu_names import gpu_candidates
from ._model_names import resolve_model_id
from ._params import LayerCounts, layer_counts, text_config
from ._specs import HardwareSpec, ModelSpec

DEFAULT_INTERNODE_BYTES_PER_S = 50.0 * GB
"""Between nodes: one 400 Gb/s InfiniBand NDR / RoCE NIC per GPU (DGX H100 layout), one direction."""

DEFAULT_GPUS_PER_NODE = 8.0
"""GPUs sharing a node's fast fabric when a hardware row leaves ``gpus_per_node`` empty (an HGX /
DGX baseboard); a TP group larger than this crosses nodes."""

_FLOP_COLUMNS = {
    "bf16": "dense_bf16_flops_per_s",
    "fp8": "dense_fp8_flops_per_s",
    "int8": "dense_int8_ops_per_s",
    "fp4": "dense_fp4_flops_per_s",
}
_FALLBACK = {"bf16": None, "fp8": "bf16", "int8": "fp8", "fp4": "bf16"}
"""The rate a dtype the chip lacks runs at: a weight-only kernel dequantises to 16-bit math."""


class CatalogError(ValueError):
    """Unknown or malformed catalog input; the message says what to do."""


def data_dir() -> Path:
    """Folder of the bundled catalogs: inside an installed wheel, else the checkout's ``data/``."""
    packaged = Path(__file__).parent / "data"
    if (packaged / "hardware.csv").exists():
        return packaged
    return Path(__file__).resolve().parent.parent / "data"


def _close(name: str, options: list[str]) -> str:
    matches = difflib.get_close_matches(name.lower(), [o.lower() for o in options], n=4, cutoff=0.4)
    lower = {o.lower(): o for o in options}
    if not matches:
        matches = [o for o in (x.lower() for x in options) if name.lower() in o][:4]
    return ", ".join(lower[m] for m in matches) if matches else "none"


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}; check the path") from None
    except UnicodeDecodeError:
        raise CatalogError(f"{path}: not a UTF-8 text file; pass a CSV") from None


# ---------------------------------------------------------------- hardware --------------------


@lru_cache(maxsize=8)
def _hardware_rows(path: str) -> dict[str, dict[str, str]]:
    rows = _read_csv(Path(path))
    if rows and "id" not in rows[0]:
        raise CatalogError(
            f"{path}: no 'id' column; a hardware CSV needs the columns of data/hardware.csv"
        )
    out: dict[str, dict[str, str]] = {}
    for i, row in enumerate(rows, start=2):
        if row["id"] in out:
            raise CatalogError(
                f"{path}:{i}: duplicate hardware id {row['id']!r}; ids must be unique"
            )
        out[row["id"]] = row
    return out


@lru_cache(maxsize=8)
def _prices(path: str) -> dict[str, float]:
    """Cheapest on-demand $ per GPU-hour for each hardware id."""
    best: dict[str, float] = {}
    for line, row in enumerate(_read_csv(Path(path)), start=2):
        gpu, price = row.get("gpu", ""), (row.get("price_per_gpu_hour") or "").strip()
        if gpu and price:
            value = _positive(price, f"{path}:{line}", "price_per_gpu_hour")
            best[gpu] = min(best.get(gpu, math.inf), value)
    return best


def hardware_ids(hardware_csv: str | Path | None = None) -> list[str]:
    """Ids in a hardware CSV (default: the bundled catalog)."""
    return list(_hardware_rows(str(hardware_csv or data_dir() / "hardware.csv")))


def hardware_capacities(hardware_csv: str | Path | None = None) -> dict[str, float | None]:
    """Each id of a hardware CSV with its HBM bytes (None where the cell is not a number), what
    ``resolve_gpu_id`` reads a stated memory size against."""
    rows = _hardware_rows(str(hardware_csv or data_dir() / "hardware.csv"))
    out: dict[str, float | None] = {}
    for gpu_id, row in rows.items():
        try:
            out[gpu_id] = float(row.get("hbm_bytes") or "nan")
        except ValueError:
            out[gpu_id] = None
        if out[gpu_id] is not None and not math.isfinite(out[gpu_id]):
            out[gpu_id] = None
    return out


def _positive(raw: str, where: str, key: str) -> float:
    """A CSV cell that must hold a positive, finite number."""
    try:
        value = float(raw)
    except ValueError:
        raise CatalogError(
            f"{where}: column {key!r} = {raw!r} is not a number; write it in SI units"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise CatalogError(f"{where}: column {key!r} = {raw!r} must be a positive, finite number")
    return value


def _field(row: dict[str, str], key: str, where: str, required: bool) -> float:
    raw = (row.get(key) or "").strip()
    if not raw:
        if required:
            raise CatalogError(
                f"{where}: column {key!r} is empty; fill it with the datasheet value (SI units)"
            )
        return math.nan
    return _positive(raw, where, key)


def hardware_from_row(
    row: dict[str, str],
    *,
    price_per_gpu_hour: float = math.nan,
    where: str = "hardware row",
    internode_bytes_per_s: float = DEFAULT_INTERNODE_BYTES_PER_S,
) -> HardwareSpec:
    """Turn one row with the columns of ``data/hardware.csv`` into a ``HardwareSpec``.

    A rate the chip lacks falls back to the rate its weight-only kernels reach (``_FALLBACK``):
    FP8 on A100 and FP4 on Hopper run dequantised 16-bit math (Marlin; the gpt-oss MXFP4 runs of
    ``../shared/data`` on H100/H200), so both take the bf16 rate.  Missing HBM size, bandwidth or bf16 rate is an error.
    """
    where = f"{where} {row.get('id', '?')!r}"
    rates: dict[str, float] = {}
    for dtype in COMPUTE_DTYPES:
        rates[dtype] = _field(row, _FLOP_COLUMNS[dtype], where, required=dtype == "bf16")
    for dtype in COMPUTE_DTYPES:
        fallback = _FALLBACK[dtype]
        while math.isnan(rates[dtype]) and fallback is not None:
            rates[dtype] = rates[fallback]
            fallback = _FALLBACK[fallback]
    return HardwareSpec(
        name=row.get("id", "custom"),
        hbm_bytes=_field(row, "hbm_bytes", where, True),
        hbm_bytes_per_s=_field(row, "hbm_bytes_per_s", where, True),
        dense_flops_per_s=jnp.asarray([rates[d] for d in COMPUTE_DTYPES]),
        link_bytes_per_s=_field(row, "link_bytes_per_s_unidir", where, False),
        gpus_per_node=_field(row, "gpus_per_node", where, False)
        if row.get("gpus_per_node")
        else DEFAULT_GPUS_PER_NODE,
        internode_bytes_per_s=internode_bytes_per_s,
        price_per_gpu_hour=price_per_gpu_hour,
    )


def load_hardware(
    name: str,
    *,
    hardware_csv: str | Path | None = None,
    prices_csv: str | Path | None = None,
) -> HardwareSpec:
    """Load accelerator ``name`` (an ``id`` of ``hardware.csv``, or a name such as ``nvidia-smi``
    prints, ``NVIDIA H100 80GB HBM3``: ``gpu_candidates``) with its cheapest listed price.

    Raises:
        CatalogError: unknown id (close matches are listed), a name several parts fit (they are
            listed), or a malformed row.
    """
    path = str(hardware_csv or data_dir() / "hardware.csv")
    rows = _hardware_rows(path)
    found = gpu_candidates(name, hardware_capacities(hardware_csv))
    if len(found) > 1:
        raise CatalogError(
            f"GPU {name!r} could be any of {', '.join(found)}; pass one of those ids"
        )
    if not found:
        raise CatalogError(
            f"unknown GPU {name!r}; close matches: {_close(name, list(rows))} "
            f"(all ids: servingmath gpus, or pass --hardware-csv with your own row)"
        )
    name = found[0]
    price = _prices(str(prices_csv or data_dir() / "prices.csv")).get(name, math.nan)
    return hardware_from_row(rows[name], price_per_gpu_hour=price, where=path)


# ---------------------------------------------------------------- models ----------------------


def model_from_counts(name: str, c: LayerCounts) -> ModelSpec:
    """Build a ``ModelSpec`` from plain counts."""
    return ModelSpec(
        name=name,
        **{k: float(getattr(c, k)) for k in LayerCounts.__dataclass_fields__},
    )


POSITIVE_CONFIG_KEYS = (
    "hidden_size",
    "n_embd",
    "d_model",
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "moe_intermediate_size",
)
"""Dimensions that are counts of at least one wherever a config gives them (``null`` = absent)."""


def _check_dimensions(config: dict[str, Any], name: str) -> None:
    cfg = text_config(config)
    for key in POSITIVE_CONFIG_KEYS:
        value = cfg.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value >= 1)
        ):
            raise CatalogError(
                f"config for {name!r}: {key} = {value!r} must be a positive whole number; "
                "fix the config.json"
            )


def model_from_config(config: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A ``ModelSpec`` from a parsed Hugging Face ``config.json``.

    Raises:
        CatalogError: a key the architecture needs is missing, not a number, or not positive.
    """
    _check_dimensions(config, name)
    try:
        return model_from_counts(name, layer_counts(config))
    except KeyError as exc:
        raise CatalogError(
            f"config for {name!r} lacks key {exc.args[0]!r}; pass a complete Hugging Face config.json"
        ) from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise CatalogError(
            f"config for {name!r} has a malformed value ({exc}); check its numbers"
        ) from None


def model_from_row(row: dict[str, str]) -> ModelSpec:
    """A ``ModelSpec`` from a ``models.csv`` dimension row (models with no ``config.json``).

    Dense GQA/MHA with a gated MLP is assumed where ``intermediate_size`` is given; otherwise the
    MLP is 4d wide.  Parameter counts come from the row when present.
    """
    name = row["id"]
    try:
        d, layers = int(row["hidden_size"]), int(row["num_layers"])
        heads, kv = int(row["heads"]), int(row["kv_heads"])
        head_dim = int(row["head_dim"])
        vocab = int(row["vocab"])
    except (KeyError, ValueError):
        raise CatalogError(
            f"models.csv row {name!r} lacks dimensions; pass the model's config.json instead"
        ) from None
    cfg = {
        "model_type": "bloom"
        if "bloom" in name
        else ("falcon" if "falcon" in name else ("gptj" if "gpt-j" in name else "llama")),
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "intermediate_size": int(row["intermediate_size"])
        if row.get("intermediate_size")
        else 4 * d,
        "tie_word_embeddings": "bloom" in name,
    }
    c = layer_counts(cfg)
    if row.get("total_params"):
        c = LayerCounts(
            **{
                **c.__dict__,
                "total_params": float(row["total_params"]),
                "active_params": float(row["active_params"] or row["total_params"]),
            }
        )
    return model_from_counts(name, c)


@lru_cache(maxsize=4)
def _model_index(catalog: str) -> dict[str, dict[str, str]]:
    return {r["id"]: r for r in _read_csv(Path(catalog) / "models.csv")}


def model_ids() -> list[str]:
    """Hugging Face ids in the bundled ``models.csv``."""
    return list(_model_index(str(data_dir())))


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"cannot read model config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CatalogError(
            f"{path}: not a UTF-8 text file; pass a Hugging Face config.json"
        ) from None
    except json.JSONDecodeError as exc:
        raise CatalogError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); pass a Hugging Face config.json"
        ) from None
    if not isinstance(config, dict):
        raise CatalogError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    return config


def _model_source(name_or_path: str) -> tuple[str, dict[str, Any] | None, dict[str, str] | None]:
    """(model name, its config.json or None, its models.csv row or None)."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.is_file():
        return path.stem, _read_config(path), None
    catalog = data_dir()
    rows = _model_index(str(catalog))
    model_id = resolve_model_id(name_or_path, rows.keys())
    if model_id is None:
        raise CatalogError(
            f"unknown model {name_or_path!r}; close matches: {_close(name_or_path, list(rows))} "
            "(or pass the path of a config.json)"
        )
    row = rows[model_id]
    if row.get("file"):
        return model_id, json.loads((catalog / row["file"]).read_text()), row
    return model_id, None, row


def load_model(name_or_path: str) -> ModelSpec:
    """Load a model by Hugging Face id, short alias (``llama-3.1-70b``), the id of a fine-tuned or
    quantised checkpoint of a catalog model (``meta-llama/Llama-3.1-8B-Instruct``, read as its base
    architecture: ``resolve_model_id``) or ``config.json`` path.

    Raises:
        CatalogError: unknown name (close matches listed) or a malformed config.
    """
    name, config, row = _model_source(name_or_path)
    return model_from_config(config, name=name) if config is not None else model_from_row(row)


MTP_CONFIG_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
"""Where configs count their multi-token-prediction modules: DeepSeek-V3/GLM, Qwen3.5, MiniMax."""


def mtp_layers(name_or_path: str) -> int:
    """Multi-token-prediction layers the model ships (0 without a config.json that lists any):
    what ``--spec-draft mtp`` drafts with."""
    _, config, _ = _model_source(name_or_path)
    if config is None:
        return 0
    cfg = text_config(config)
    counts = [cfg.get(k) for k in MTP_CONFIG_KEYS]
    given = [int(c) for c in counts if isinstance(c, (int, float)) and math.isfinite(c)]
    return max(given, default=0)


LENGTH_SCALED_ROPE = ("linear", "dynamic", "yarn")
"""RoPE scalings that stretch the trained context by their ``factor``; ``llama3``, ``longrope``
and ``su`` configs already state the stretched length in ``max_position_embeddings``."""


def model_context_tokens(name_or_path: str) -> int | None:
    """The longest context the model's config.json admits, as vLLM derives its largest
    ``--max-model-len``: ``max_position_embeddings``, times the RoPE scaling ``factor`` for
    linear/dynamic scaling and for YaRN (from ``original_max_position_embeddings`` when given).
    None when there is no config (a catalog row) or it states no length."""
    _, config, _ = _model_source(name_or_path)
    if config is None:
        return None
    cfg = text_config(config)
    length = cfg.get("max_position_embeddings")
    if not isinstance(length, (int, float)) or not math.isfinite(length) or length < 1:
        return None
    rope = cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if kind in LENGTH_SCALED_ROPE and isinstance(factor, (int, float)) and factor >= 1:
        base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
        length = (base if isinstance(base, (int, float)) and base >= 1 else length) * factor
    return int(length)
