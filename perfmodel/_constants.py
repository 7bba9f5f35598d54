"""Named unit constants and dtype widths.  SI units everywhere inside the model."""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
"""Decimal gigabyte (bandwidths, vendor "GB/s")."""
GiB = 2.0**30
"""Binary gibibyte (HBM capacity, vendor nominal "GB" of device memory)."""
TERA = 1e12

KV_FACTOR = 2.0
"""One key and one value vector per token per KV head (Vaswani et al. 2017)."""

FLOPS_PER_MAC = 2.0
"""A multiply-accumulate is two floating-point operations."""

ACTIVATION_BYTES = 2.0
"""Width of activations exchanged by TP all-reduces and PP sends (bf16/fp16)."""

LOW_PRECISION_ACTIVATION_BYTES = 1.0
"""Width of a GEMM's quantised input activations at an FP8/INT8/FP4 rate (per-token scales)."""

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
}
"""Bytes per element of each storage dtype."""

COMPUTE_DTYPES: tuple[str, ...] = ("bf16", "fp8", "int8", "fp4")
"""Tensor-core rate classes, in the order of ``HardwareSpec.dense_flops_per_s``."""

WEIGHT_DTYPE_COMPUTE: dict[str, str] = {
    "fp32": "bf16",
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "bf16",  # weight-only quantisation (AWQ/GPTQ): dequantised to 16-bit for the GEMM
    "fp4": "fp4",
}
"""Which tensor-core rate a weight dtype's GEMMs run at."""

SECONDS_PER_HOUR = 3600.0
