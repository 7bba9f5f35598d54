"""Host-memory KV tier: more concurrent sequences, paid for in host -> device transfer per step.

Sequences beyond what HBM holds keep their KV in host memory; every decode step streams it to the
device over PCIe (offloaded attention KV, FlexGen: Sheng et al., ICML 2023), overlapped with the
HBM-bound step at best:  step(B_h + x) = max(tau_d(B_h + x), x * s / bw_host), s the KV bytes of
one sequence on one device.  Throughput (B_h + x) / step rises with x while the transfer hides
under the step and falls once it does not, so the best x solves x * s / bw_host = tau_d(B_h + x),
clipped to what the host tier holds.  It pays when a sequence's transfer is short next to the
weight-dominated step: short contexts, KV-limited batches, fast host links.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._floors import COUNT_FLOOR
from ._memory import kv_bytes_per_sequence, kv_sequence_share, max_concurrent_requests
from ._reuse import monotone_root
from ._smooth import smooth_max, smooth_min
from ._specs import System
from ._step import decode_step
from ._types import Array, ArrayLike

PCIE5_X16_BYTES_PER_S = 63e9
"""Host <-> GPU bandwidth of one PCIe 5.0 x16 link, one direction: 32 GT/s per lane x 16 lanes
x 128/130 line encoding / 8 bits per byte ~ 63 GB/s."""


class HostTier(eqx.Module):
    """Decode throughput of one replica with and without the host tier (tokens/s; seconds)."""

    hbm_sequences: Array
    host_sequences_max: Array
    host_sequences_used: Array
    host_transfer_s_per_step: Array
    tokens_per_s_hbm_only: Array
    tokens_per_s_with_host: Array
    gain_fraction: Array


def host_tier(
    system: System,
    *,
    sequence_tokens: ArrayLike,
    temperature: float = 0.0,
) -> HostTier:
    """Best use of ``deployment.host_kv_bytes`` per device at ``host_kv_bytes_per_s``.

    Args:
        sequence_tokens: prompt + output tokens of a sequence (its KV at the end of decode; the
            mean decode context is taken as the same, an upper bound on the transfer).

    Returns:
        ``gain_fraction`` = tokens/s with the tier / without - 1 (``inf`` when the tier is what
        lets a single sequence run at all); ``host_sequences_used`` = 0 when it does not pay.
    """
    model, hardware, deployment = system.model, system.hardware, system.deployment
    hbm_only = eqx.tree_at(lambda d: d.host_kv_bytes, deployment, jnp.zeros(()))
    cap = deployment.max_num_seqs
    b_h = smooth_min(
        max_concurrent_requests(model, hardware, hbm_only, sequence_tokens, temperature),
        cap,
        temperature,
    )
    b_all = smooth_min(
        max_concurrent_requests(model, hardware, deployment, sequence_tokens, temperature),
        cap,
        temperature,
    )
    x_max = jnp.maximum(b_all - b_h, 0.0)
    seq_bytes = kv_bytes_per_sequence(
        model, deployment.kv_bytes_per_elem, sequence_tokens, temperature
    ) * kv_sequence_share(model, deployment)
    bw = deployment.host_kv_bytes_per_s
    has_link = bw > 0
    per_seq_s = jnp.where(has_link, seq_bytes / jnp.where(has_link, bw, 1.0), jnp.inf)

    def tau(n):
        return decode_step(system, jnp.maximum(n, 1.0), sequence_tokens, temperature).total_s

    def transfer_excess(x):
        return x * per_seq_s - tau(b_h + x)

    x_cross = monotone_root(transfer_excess, 0.0, jnp.maximum(x_max, COUNT_FLOOR))
    x = jnp.where(has_link & (x_max > 0), jnp.minimum(x_cross, x_max), 0.0)

    def transfer_s(n):
        return jnp.where(n > 0, n * jnp.where(has_link, per_seq_s, 0.0), 0.0)

    def tokens_per_s(n):
        running = b_h + n
        rate = running / smooth_max(tau(running), transfer_s(n), temperature)
        return jnp.where(running >= 1.0, rate, 0.0)

    if temperature == 0.0:  # whole sequences: the better neighbour of the crossing
        lo, hi = jnp.floor(x), jnp.minimum(jnp.ceil(x), x_max)
        x_int = jnp.where(tokens_per_s(hi) > tokens_per_s(lo), hi, lo)
    else:
        x_int = x
    transfer = transfer_s(x_int)
    tps_host = tokens_per_s(x_int)
    tps_hbm = tokens_per_s(0.0)
    ratio = tps_host / jnp.where(tps_hbm > 0, tps_hbm, 1.0) - 1.0
    return HostTier(
        hbm_sequences=b_h,
        host_sequences_max=x_max,
        host_sequences_used=x_int,
        host_transfer_s_per_step=transfer,
        tokens_per_s_hbm_only=tps_hbm,
        tokens_per_s_with_host=tps_host,
        gain_fraction=jnp.where(tps_hbm > 0, ratio, jnp.where(tps_host > 0, jnp.inf, 0.0)),
    )
