"""The discrete knob grid and one configuration on it.

A configuration is a vector of integer indices into ``Grid``'s choice tuples plus a replica count;
the grid is static (Python tuples), so every array built from it has a static shape and the search
and the exhaustive referee compile once.

Pool split (disaggregation): index 0 of ``pool_split`` is the colocated engine; index i >= 1 is a
prefill:decode split with ``pool_ratios[i - 1] = (p, d)`` engine instances per replica unit, the
prefill pool on GPU ``prefill_gpu`` at TP ``prefill_tp`` and PP ``prefill_pp``, the decode pool on
GPU ``gpu`` at TP ``tp`` and PP ``pp`` (both pools share the dtypes and batch limits): a prefill
engine is compute-bound and a decode engine bandwidth- and KV-bound, so each pool takes the
parallelism that serves it cheapest (aiconfigurator's disaggregated search sizes each pool's
apart).  A colocated configuration carries ``prefill_gpu = 0``, ``prefill_tp = tp`` and
``prefill_pp = pp`` (its canonical form).

MoE layout (``moe_layout``): how a MoE model's TP ranks split its layers (``MOE_LAYOUTS``): "tp"
splits every expert over all ranks; "ep" gives each rank whole experts (expert parallelism over
all TP ranks); "ep/2" splits the experts over EP = TP / 2 groups of two ranks, each expert
tensor-parallel inside its group (SGLang's ``--ep-size`` below ``--tp-size``, TensorRT-LLM's
``--ep_size`` with a MoE TP of 2; the step prices the same expert FLOPs and bytes per rank in
GEMMs between "tp"'s and "ep"'s widths, ``perfmodel._step``); "ep+dp" also runs attention data-parallel on every rank (each rank its own sequences,
attention weights and KV).  A layout whose degrees equal "tp"'s at a TP (every layout at TP 1,
"ep/2" at TP 2), or a dense model, has only "tp" (canonical form).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from perfmodel import COMPUTE_DTYPES, DTYPE_BYTES, WEIGHT_DTYPE_COMPUTE, Deployment, ModelSpec

KNOBS: tuple[str, ...] = (
    "gpu",
    "tp",
    "pp",
    "kv_dtype",
    "weight_dtype",
    "max_num_batched_tokens",
    "max_num_seqs",
    "chunk_size",
    "spec_k",
    "pool_split",
    "prefill_gpu",
    "moe_layout",
    "prefill_tp",
    "prefill_pp",
)
"""Index columns of a configuration array, in order; the replica count is kept beside them."""

(
    GPU,
    TP,
    PP,
    KV,
    WEIGHT,
    MNBT,
    SEQS,
    CHUNK,
    SPEC,
    POOL,
    PREFILL_GPU,
    MOE,
    PREFILL_TP,
    PREFILL_PP,
) = range(len(KNOBS))


class MoeLayout(NamedTuple):
    """How one MoE layout sets the expert-parallel and attention data-parallel degrees from TP:
    EP = max(tp^expert_share / expert_divisor, 1) and DP_attention = tp^attention_share (a share
    of 1 makes the degree TP, 0 makes it 1)."""

    expert_share: float
    attention_share: float
    expert_divisor: int = 1


MOE_LAYOUTS: dict[str, MoeLayout] = {
    "tp": MoeLayout(0.0, 0.0),
    "ep": MoeLayout(1.0, 0.0),
    "ep/2": MoeLayout(1.0, 0.0, expert_divisor=2),
    "ep+dp": MoeLayout(1.0, 1.0),
}
"""Layout name -> its ``MoeLayout`` (``perfmodel.Deployment.expert_parallel`` / ``attention_dp``)."""


class Grid(NamedTuple):
    """Legal discrete values of each knob (static).

    Holds shapes and numbers only (no names), so problems with different GPUs or models share one
    compiled search.

    Attributes:
        num_gpus: candidate GPU types (order of the stacked ``HardwareSpec``).
        tp: tensor-parallel degrees; only those dividing the attention heads are used.
        pp: pipeline-parallel degrees.
        kv_dtypes: KV-cache storage dtypes (``DTYPE_BYTES`` names).
        weight_dtypes: weight storage dtypes.
        max_num_batched_tokens: iteration token budgets B.
        max_num_seqs: caps on sequences in one iteration.
        chunk_sizes: prefill chunk c per request per iteration, legal when c <= B; 0 means
            "c = B" (one merged knob, as vLLM's default chunked prefill).
        spec_k: speculative draft lengths (0 = off).
        pool_ratios: prefill:decode instances per replica unit of a disaggregated deployment
            (empty: colocated only).
        max_replicas: the largest replica count (replica units when disaggregated) searched.
        scheduler_polls: decode iterations between the engine scheduler's polls for new
            requests, one value the search does not vary (SGLang's
            ``--scheduler-recv-interval``; 1 = every iteration, ``perfmodel._polling``).
        moe_layouts: ``MOE_LAYOUTS`` names a MoE model may take (a dense model takes "tp").
    """

    num_gpus: int
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4)
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8", "int8", "int4")
    weight_dtypes: tuple[str, ...] = ("bf16", "fp8", "int4")
    max_num_batched_tokens: tuple[int, ...] = (1024, 2048, 4096, 8192)
    max_num_seqs: tuple[int, ...] = (64, 128, 256, 512)
    chunk_sizes: tuple[int, ...] = (0,)
    spec_k: tuple[int, ...] = (0,)
    pool_ratios: tuple[tuple[int, int], ...] = ()
    max_replicas: int = 64
    scheduler_polls: int = 1
    moe_layouts: tuple[str, ...] = ("tp",)

    def sizes(self) -> tuple[int, ...]:
        """Number of choices per index column (``KNOBS`` order)."""
        return (
            self.num_gpus,
            len(self.tp),
            len(self.pp),
            len(self.kv_dtypes),
            len(self.weight_dtypes),
            len(self.max_num_batched_tokens),
            len(self.max_num_seqs),
            len(self.chunk_sizes),
            len(self.spec_k),
            1 + len(self.pool_ratios),
            self.num_gpus,
            len(self.moe_layouts),
            len(self.tp),
            len(self.pp),
        )

    @property
    def disaggregated(self) -> bool:
        """Whether split pools are among the choices (static: skips their model otherwise)."""
        return bool(self.pool_ratios)

    @property
    def speculative(self) -> bool:
        return max(self.spec_k) > 0

    def legal_tp(self, model: ModelSpec) -> np.ndarray:
        """Boolean mask over ``tp``: TP must divide the attention heads (vLLM's requirement)."""
        heads = int(model.num_heads)
        return np.asarray([heads % t == 0 for t in self.tp])

    def legal_layout(self, model: ModelSpec) -> np.ndarray:
        """Boolean mask over ``moe_layouts``: expert and attention splits need routed experts."""
        moe = bool(model.has_routed_experts)
        return np.asarray([moe or name == "tp" for name in self.moe_layouts])

    def legal_chunk(self) -> np.ndarray:
        """Boolean (len(max_num_batched_tokens), len(chunk_sizes)): chunk c <= budget B."""
        return np.asarray([[c <= b for c in self.chunk_sizes] for b in self.max_num_batched_tokens])

    def canonical(self, configs: np.ndarray, model: ModelSpec) -> np.ndarray:
        """Nearest legal form of index rows: an illegal TP (either pool's) moves to the nearest
        legal one, a chunk above the budget to the largest legal chunk, a colocated row gets
        ``prefill_gpu = 0``, ``prefill_tp = tp`` and ``prefill_pp = pp``, and a dense model or
        TP 1 takes the "tp" layout (the others equal it there)."""
        out = np.array(configs, dtype=np.int32, copy=True)
        legal = np.flatnonzero(self.legal_tp(model))
        for col in (TP, PREFILL_TP):
            bad = ~self.legal_tp(model)[out[..., col]]
            if bad.any():
                near = legal[np.abs(legal[None, :] - out[..., col][bad][:, None]).argmin(axis=1)]
                out[..., col][bad] = near
        ok = self.legal_chunk()
        largest = np.asarray([np.flatnonzero(r)[-1] if r.any() else 0 for r in ok])
        over = ~ok[out[..., MNBT], out[..., CHUNK]]
        out[..., CHUNK] = np.where(over, largest[out[..., MNBT]], out[..., CHUNK])
        out[..., PREFILL_GPU] = np.where(out[..., POOL] == 0, 0, out[..., PREFILL_GPU])
        out[..., PREFILL_TP] = np.where(out[..., POOL] == 0, out[..., TP], out[..., PREFILL_TP])
        out[..., PREFILL_PP] = np.where(out[..., POOL] == 0, out[..., PP], out[..., PREFILL_PP])
        if "tp" in self.moe_layouts:
            plain = self.moe_layouts.index("tp")
            as_tp = ~self.distinct_layout()[out[..., TP], out[..., MOE]]
            illegal = ~self.legal_layout(model)[out[..., MOE]]
            out[..., MOE] = np.where(as_tp | illegal, plain, out[..., MOE])
        return out

    def distinct_layout(self) -> np.ndarray:
        """Boolean (len(tp), len(moe_layouts)): the layout is itself at that TP, its degrees
        whole divisors of TP and not both 1 (else it is "tp" there); "tp" always is."""
        out = np.ones((len(self.tp), len(self.moe_layouts)), dtype=bool)
        for i, tp in enumerate(self.tp):
            for j, name in enumerate(self.moe_layouts):
                ep, dp = layout_degrees(name, tp)
                out[i, j] = name == "tp" or ((ep, dp) != (1, 1) and tp % ep == 0 and tp % dp == 0)
        return out

    def all_configs(self, model: ModelSpec) -> np.ndarray:
        """Every legal index vector (canonical, each once), shape (n, len(KNOBS)), int32, in
        lexicographic (``itertools.product``) order."""
        c = np.indices(self.sizes(), dtype=np.int32).reshape(len(KNOBS), -1)
        return np.ascontiguousarray(c[:, self._kept(c, model)].T)

    def count_configs(self, model: ModelSpec) -> int:
        """``len(all_configs(model))`` without listing them: the legality of a row reads only
        the ``_CONSTRAINED`` knobs, so the count is the legal combinations of those times the
        choices of every other knob."""
        sizes = self.sizes()
        c = np.indices(
            [n if k in _CONSTRAINED else 1 for k, n in enumerate(sizes)], dtype=np.int32
        ).reshape(len(KNOBS), -1)
        free = math.prod(n for k, n in enumerate(sizes) if k not in _CONSTRAINED)
        return int(np.count_nonzero(self._kept(c, model))) * free

    def _kept(self, c: np.ndarray, model: ModelSpec) -> np.ndarray:
        """Boolean per column of index vectors ``c`` (len(KNOBS), n): legal (both pools' TP, the
        chunk within the budget, a colocated row with the default prefill pool) and canonical
        (``canonical`` leaves it as it is: a layout that equals "tp" there, a dense model or
        TP 1, is listed once, as "tp")."""
        legal, chunk_ok = self.legal_tp(model), self.legal_chunk()
        keep = (
            legal[c[TP]]
            & legal[c[PREFILL_TP]]
            & chunk_ok[c[MNBT], c[CHUNK]]
            & (
                (c[POOL] > 0)
                | ((c[PREFILL_GPU] == 0) & (c[PREFILL_TP] == c[TP]) & (c[PREFILL_PP] == c[PP]))
            )
        )
        if "tp" in self.moe_layouts:
            own = self.distinct_layout()[c[TP], c[MOE]] & self.legal_layout(model)[c[MOE]]
            keep &= (c[MOE] == self.moe_layouts.index("tp")) | own
        return keep


_CONSTRAINED = frozenset({TP, PREFILL_TP, PP, PREFILL_PP, MNBT, CHUNK, POOL, PREFILL_GPU, MOE})
"""Knobs whose values decide whether a row is legal and canonical (``Grid._kept``)."""


def grid_tables(grid: Grid) -> dict[str, jnp.ndarray]:
    """Numeric value of every choice, as arrays the traced code indexes or mixes with weights."""
    compute_mix = [
        [1.0 if c == WEIGHT_DTYPE_COMPUTE[w] else 0.0 for c in COMPUTE_DTYPES]
        for w in grid.weight_dtypes
    ]
    ratios = ((0, 1),) + tuple(grid.pool_ratios)  # index 0 (colocated): no prefill pool
    return {
        "tp": jnp.asarray(grid.tp, dtype=float),
        "pp": jnp.asarray(grid.pp, dtype=float),
        "kv_bytes": jnp.asarray([DTYPE_BYTES[d] for d in grid.kv_dtypes]),
        "weight_bytes": jnp.asarray([DTYPE_BYTES[d] for d in grid.weight_dtypes]),
        "compute_mix": jnp.asarray(compute_mix),
        "mnbt": jnp.asarray(grid.max_num_batched_tokens, dtype=float),
        "mnseq": jnp.asarray(grid.max_num_seqs, dtype=float),
        "chunk": jnp.asarray(grid.chunk_sizes, dtype=float),
        "spec_k": jnp.asarray(grid.spec_k, dtype=float),
        "prefill_units": jnp.asarray([r[0] for r in ratios], dtype=float),
        "decode_units": jnp.asarray([r[1] for r in ratios], dtype=float),
        "scheduler_polls": jnp.asarray(float(grid.scheduler_polls)),
        "expert_share": jnp.asarray([MOE_LAYOUTS[n].expert_share for n in grid.moe_layouts]),
        "attention_share": jnp.asarray([MOE_LAYOUTS[n].attention_share for n in grid.moe_layouts]),
        "expert_divisor": jnp.asarray(
            [MOE_LAYOUTS[n].expert_divisor for n in grid.moe_layouts], dtype=float
        ),
    }


def one_hot_weights(config: jnp.ndarray, grid: Grid) -> tuple[jnp.ndarray, ...]:
    """The discrete configuration as the relaxed representation's weights (one-hot per choice)."""
    return tuple(jnp.eye(n)[config[..., i]] for i, n in enumerate(grid.sizes()))


def _log_mix(w: jnp.ndarray, values: jnp.ndarray) -> jnp.ndarray:
    """2^(w . log2 values); the choice itself at one-hot ``w`` (XLA's exp2 is not exact at
    integers: 2^13 came back as 8191.99999999998, and a prompt of exactly one budget then took
    ceil(1 + 2e-15) = 2 chunks)."""
    exact = jnp.max(w, axis=-1) >= 1.0
    return jnp.where(exact, w @ values, jnp.exp2(w @ jnp.log2(values)))


def chunk_from_weights(
    weights: tuple[jnp.ndarray, ...], tables: dict[str, jnp.ndarray]
) -> jnp.ndarray:
    """Prefill chunk c (tokens), log-mixed; a 0 choice stands for the token budget B."""
    budget = _log_mix(weights[MNBT], tables["mnbt"])
    per_choice = jnp.where(tables["chunk"] > 0, tables["chunk"], budget)
    return jnp.minimum(_log_mix(weights[CHUNK], per_choice), budget)


def prefill_pool_weights(weights: tuple[jnp.ndarray, ...]) -> tuple[jnp.ndarray, ...]:
    """The (relaxed) knob weights of a split's prefill pool: its own GPU type, TP and PP choices
    (``prefill_gpu``, ``prefill_tp``, ``prefill_pp``) in the GPU, TP and PP columns, every other
    knob shared with the decode pool; whatever reads a configuration's engine (its hardware,
    deployment, efficiency draws, memory) reads the prefill pool's from these."""
    own = {GPU: weights[PREFILL_GPU], TP: weights[PREFILL_TP], PP: weights[PREFILL_PP]}
    return tuple(own.get(k, w) for k, w in enumerate(weights))


def prefill_pool_config(config):
    """A configuration row (or rows) as its prefill pool runs (``prefill_pool_weights`` at
    one-hot): ``prefill_gpu``, ``prefill_tp`` and ``prefill_pp`` in the GPU, TP and PP columns."""
    c = jnp.asarray(config)
    for col, own in ((GPU, PREFILL_GPU), (TP, PREFILL_TP), (PP, PREFILL_PP)):
        c = c.at[..., col].set(c[..., own])
    return c


def engine_gpus(weights: tuple[jnp.ndarray, ...], tables: dict[str, jnp.ndarray]) -> jnp.ndarray:
    """GPUs of one engine, TP x PP, each degree log-mixed as ``deployment_from_weights`` mixes
    it (a split's prefill pool: ``prefill_pool_weights``)."""
    return _log_mix(weights[TP], tables["tp"]) * _log_mix(weights[PP], tables["pp"])


def on_gpu_type(configs: np.ndarray, gpu: int) -> np.ndarray:
    """Boolean per row of ``configs`` (..., len(KNOBS)): every engine of the configuration runs
    on GPU type ``gpu`` (colocated on it, or a pool split whose prefill pool is that type too).
    The fleet and the forecast count and cap GPUs per type, so each of their configurations
    must sit on one type."""
    c = np.asarray(configs)
    return (c[..., GPU] == gpu) & ((c[..., POOL] == 0) | (c[..., PREFILL_GPU] == gpu))


def layout_degrees(layout: str, tp: int) -> tuple[int, int]:
    """(expert-parallel degree, attention data-parallel degree) of a ``MOE_LAYOUTS`` name at TP
    ``tp`` (``MoeLayout``; ``deployment_from_weights`` at one-hot weights)."""
    spec = MOE_LAYOUTS[layout]
    ep = max(tp // spec.expert_divisor, 1) if spec.expert_share else 1
    return ep, (tp if spec.attention_share else 1)


def _share_of_tp(tp: jnp.ndarray, share: jnp.ndarray) -> jnp.ndarray:
    """tp^share: 1 at share 0, tp at share 1 (exactly: XLA's power is not exact at integers),
    and in between, log-mixed like the other degrees, for relaxed weights."""
    mixed = jnp.power(tp, jnp.clip(share, 0.0, 1.0))
    return jnp.where(share >= 1.0, tp, jnp.where(share <= 0.0, 1.0, mixed))


def deployment_from_weights(
    weights: tuple[jnp.ndarray, ...], tables: dict[str, jnp.ndarray], replicas: jnp.ndarray
) -> Deployment:
    """A (relaxed) ``Deployment``: each numeric knob is the weight-average of its choices.

    TP, PP and the token budgets mix in log2 (so a 50/50 mix of 2 and 8 is 4); at one-hot weights
    this is exact.  ``max_num_batched_tokens`` is the iteration budget B (the chunk is separate:
    ``chunk_from_weights``).
    """
    tp = _log_mix(weights[TP], tables["tp"])
    pp = _log_mix(weights[PP], tables["pp"])
    layout = weights[MOE]
    return Deployment(
        tp=tp,
        pp=pp,
        replicas=replicas,
        weight_bytes_per_param=weights[WEIGHT] @ tables["weight_bytes"],
        kv_bytes_per_elem=weights[KV] @ tables["kv_bytes"],
        compute_dtype_mix=weights[WEIGHT] @ tables["compute_mix"],
        max_num_batched_tokens=_log_mix(weights[MNBT], tables["mnbt"]),
        max_num_seqs=_log_mix(weights[SEQS], tables["mnseq"]),
        microbatches=pp,
        scheduler_polls=tables["scheduler_polls"],
        expert_parallel=jnp.maximum(
            _share_of_tp(tp, layout @ tables["expert_share"])
            / _log_mix(layout, tables["expert_divisor"]),
            1.0,
        ),
        attention_dp=_share_of_tp(tp, layout @ tables["attention_share"]),
    )
