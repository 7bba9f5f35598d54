"""``optimize``'s options: the search problem (``problem``) with the knobs only ``optimize``
searches (disaggregated pool ratios and their KV hand-off bandwidth), the context length every
engine must serve, the checks run on the recommendation, and the files it writes (figures, the
HTML report, launch scripts).
"""

from __future__ import annotations

import argparse

from .grid import add_chunk_argument, add_moe_layout_argument, add_pool_ratio_argument
from .outputs import add_report_argument
from .problem import add_problem_arguments, context_tokens
from .speculation import add_speculation_arguments
from .validators import nonnegative_int, output_dir, positive_int


def add_optimize_arguments(parser: argparse.ArgumentParser) -> None:
    """The search problem, then optimize's own: the replica bound, the recommendation's checks
    (--no-verify, --simulate), its files (--plot, --report, --emit), the context every engine
    must serve, and the knobs beyond dtypes (prefill chunks, pool ratios, KV hand-off bandwidth,
    speculation)."""
    add_problem_arguments(parser)
    parser.add_argument(
        "--max-replicas", type=positive_int, default=64, help="largest replica count (default 64)"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the re-check with the closed forms (serving_metrics, its speculative and "
        "disaggregated forms)",
    )
    parser.add_argument(
        "--simulate",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="also run the recommendation through the simulator on N requests (two pools "
        "for a split, speculation for k > 0)",
    )
    parser.add_argument(
        "--plot",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write PNGs here: cost vs SLO probability, posterior of p95 TTFT/TPOT",
    )
    add_report_argument(parser)
    parser.add_argument(
        "--max-model-len",
        type=context_tokens,
        default=None,
        metavar="TOKENS",
        help="context length every engine must serve (vLLM --max-model-len, SGLang "
        "--context-length, TensorRT-LLM --max_seq_len; default: the workload's longest "
        "requests; at most the model's own context, from its config.json); a configuration "
        "whose KV cache cannot hold one sequence this long is infeasible",
    )
    parser.add_argument(
        "--emit",
        type=output_dir,
        default=None,
        metavar="DIR",
        help="write the recommendation's launch scripts (vllm.sh, sglang.sh, trtllm.sh) and a "
        "Kubernetes deployment.yaml (one Deployment per pool) into this folder",
    )
    add_chunk_argument(parser)
    add_moe_layout_argument(parser)
    add_pool_ratio_argument(parser)
    add_speculation_arguments(parser)
