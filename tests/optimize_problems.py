"""The small optimisation problem the forecast and plot tests share: Llama-3.1-8B on h100-sxm,
TP 1 or 2, bf16, 10 req/s of 1,024-token prompts and 256-token outputs, p95 TTFT <= 1 s and
p95 TPOT <= 50 ms."""

from optimize import Grid, Workload, make_problem
from perfmodel import load_model

GRID = Grid(
    num_gpus=1,
    tp=(1, 2),
    pp=(1,),
    kv_dtypes=("bf16",),
    weight_dtypes=("bf16",),
    max_num_batched_tokens=(2048,),
    max_num_seqs=(256,),
    max_replicas=256,
)

WORKLOAD = Workload(
    arrival_rate_per_s=10.0,
    prompt_tokens_mean=1024.0,
    output_tokens_mean=256.0,
    output_tokens_cv=1.0,
)


def small_problem(
    *,
    max_replicas: int,
    num_draws: int,
    gpus=("h100-sxm",),
    slo_tpot_p95_s: float = 0.05,
    engine: str | None = None,
):
    """The shared problem with ``max_replicas`` replicas at most and ``num_draws`` draws, priced
    for ``engine`` (None: pooled engines)."""
    return make_problem(
        load_model("meta-llama/Llama-3.1-8B"),
        gpus,
        WORKLOAD,
        slo_ttft_p95_s=1.0,
        slo_tpot_p95_s=slo_tpot_p95_s,
        grid=GRID._replace(max_replicas=max_replicas),
        num_draws=num_draws,
        engine=engine,
    )
