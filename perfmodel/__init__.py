"""perfmodel: LLM serving as pure, differentiable budgets (memory, compute, bandwidth, comms)."""

from . import dynamics as dynamics, features as features
from ._catalog import (
    MTP_CONFIG_KEYS as MTP_CONFIG_KEYS,
    CatalogError as CatalogError,
    data_dir as data_dir,
    hardware_capacities as hardware_capacities,
    hardware_from_row as hardware_from_row,
    hardware_ids as hardware_ids,
    load_hardware as load_hardware,
    load_model as load_model,
    model_context_tokens as model_context_tokens,
    model_from_config as model_from_config,
    model_from_row as model_from_row,
    model_ids as model_ids,
    mtp_layers as mtp_layers,
)
from ._compute import (
    StepTime as StepTime,
    attention_flops as attention_flops,
    compute_fraction as compute_fraction,
    linear_flops as linear_flops,
    peak_flops_per_s as peak_flops_per_s,
)
from ._constants import (
    COMPUTE_DTYPES as COMPUTE_DTYPES,
    DTYPE_BYTES as DTYPE_BYTES,
    GB as GB,
    TERA as TERA,
    WEIGHT_DTYPE_COMPUTE as WEIGHT_DTYPE_COMPUTE,
    GiB as GiB,
)
from ._fit_check import (
    TP_CHOICES as TP_CHOICES,
    smallest_fitting_parallelism as smallest_fitting_parallelism,
    tp_divides_heads as tp_divides_heads,
)
from ._floors import (
    COUNT_FLOOR as COUNT_FLOOR,
    LOG_VARIANCE_FLOOR as LOG_VARIANCE_FLOOR,
    POSITIVE_FLOOR as POSITIVE_FLOOR,
    PROBABILITY_FLOOR as PROBABILITY_FLOOR,
    RATE_FLOOR_PER_S as RATE_FLOOR_PER_S,
    SHARE_FLOOR as SHARE_FLOOR,
    TIME_FLOOR_S as TIME_FLOOR_S,
)
from ._gpu_names import (
    gpu_candidates as gpu_candidates,
    gpu_parts as gpu_parts,
    resolve_gpu_id as resolve_gpu_id,
)
from ._memory import (
    allocated_tokens_per_sequence as allocated_tokens_per_sequence,
    kv_bytes_per_sequence as kv_bytes_per_sequence,
    kv_bytes_per_token as kv_bytes_per_token,
    kv_bytes_per_token_per_gpu as kv_bytes_per_token_per_gpu,
    kv_capacity_tokens as kv_capacity_tokens,
    kv_device_share as kv_device_share,
    kv_free_bytes_per_gpu as kv_free_bytes_per_gpu,
    kv_sequence_share as kv_sequence_share,
    kv_shard_fraction as kv_shard_fraction,
    max_concurrent_requests as max_concurrent_requests,
    weight_bytes as weight_bytes,
    weight_bytes_per_gpu as weight_bytes_per_gpu,
    workspace_bytes_per_gpu as workspace_bytes_per_gpu,
)
from ._model_names import (
    architecture_key as architecture_key,
    checkpoint_weight_dtype as checkpoint_weight_dtype,
    resolve_model_id as resolve_model_id,
    served_model_id as served_model_id,
)
from ._ops import (
    ATTENTION_QUERY_TILE as ATTENTION_QUERY_TILE,
    COLLECTIVE_KINDS as COLLECTIVE_KINDS,
    KERNEL_FIELDS as KERNEL_FIELDS,
    KernelEfficiency as KernelEfficiency,
    attention_tile_flops as attention_tile_flops,
    attention_time_s as attention_time_s,
    collective_time_s as collective_time_s,
    elementwise_time_s as elementwise_time_s,
    gemm_time_s as gemm_time_s,
    prefill_attention_flops as prefill_attention_flops,
)
from ._parallel import (
    pp_bubble_fraction as pp_bubble_fraction,
    pp_transfer_s as pp_transfer_s,
    ring_all_reduce_s as ring_all_reduce_s,
    tp_comm_s as tp_comm_s,
)
from ._sheet import (
    BINDING_BUDGETS as BINDING_BUDGETS,
    HARDWARE_BUDGETS as HARDWARE_BUDGETS,
    BudgetSheet as BudgetSheet,
    binding_budget as binding_budget,
    budget_sheet as budget_sheet,
    decode_elasticities as decode_elasticities,
    decode_tokens_per_s_max as decode_tokens_per_s_max,
)
from ._smooth import smooth_ceil as smooth_ceil, smooth_min as smooth_min
from ._specs import (
    PREFILL_FIRST_ENGINES as PREFILL_FIRST_ENGINES,
    Deployment as Deployment,
    Efficiency as Efficiency,
    HardwareSpec as HardwareSpec,
    ModelSpec as ModelSpec,
    System as System,
    compute_dtype_weights as compute_dtype_weights,
    engine_prefill_first as engine_prefill_first,
    strongly_typed as strongly_typed,
    unnamed as unnamed,
)
from ._step import (
    decode_step as decode_step,
    expected_experts_touched as expected_experts_touched,
    forward_step as forward_step,
    prefill_step as prefill_step,
    step_total_s as step_total_s,
)
from ._types import Array as Array, ArrayLike as ArrayLike
from .dynamics import (
    Percentiles as Percentiles,
    ServingMetrics as ServingMetrics,
    Workload as Workload,
    serving_metrics as serving_metrics,
    simulate as simulate,
)
