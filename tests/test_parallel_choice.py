"""Parallelism choices: the rule of thumb (one GPU -> replicas, one node -> TP, several nodes ->
PP) emerges from comparing the budgets; PP efficiency falls with few microbatches."""

import pytest

from perfmodel import Deployment, Efficiency, System, forward_step, load_hardware, load_model
from perfmodel._parallel_choice import best_parallelism, parallelism_options, with_parallelism

H100 = load_hardware("h100-sxm")
EFF = Efficiency()
BASE = Deployment.create()
LEN_IN, LEN_OUT = 2000.0, 500.0


def _best(name, gpus):
    return best_parallelism(System(load_model(name), H100, BASE, EFF), gpus, LEN_IN, LEN_OUT)


def test_a_model_that_fits_one_gpu_runs_as_replicas():
    best = _best("meta-llama/Llama-3.1-8B", 8)
    assert (best.tp, best.pp, best.replicas) == (1, 1, 8)


def test_a_model_that_fits_one_node_uses_tp_not_pp():
    best = _best("meta-llama/Llama-3.1-70B", 8)
    assert best.tp > 1 and best.pp == 1 and not best.spans_nodes
    options = parallelism_options(
        System(load_model("meta-llama/Llama-3.1-70B"), H100, BASE, EFF), 8, LEN_IN, LEN_OUT
    )
    tp8 = next(o for o in options if (o.tp, o.pp) == (8, 1))
    pp8 = next(o for o in options if (o.tp, o.pp) == (1, 8))
    assert tp8.tokens_per_s > 3.0 * pp8.tokens_per_s and tp8.tpot_s_batch1 < pp8.tpot_s_batch1


def test_a_model_that_spans_nodes_uses_pp_across_and_tp_within():
    best = _best("meta-llama/Llama-3.1-405B", 16)  # 810 GB of bf16 weights > 8 x 80 GB
    assert best.spans_nodes and best.tp == int(H100.gpus_per_node) and best.pp == 2
    options = parallelism_options(
        System(load_model("meta-llama/Llama-3.1-405B"), H100, BASE, EFF), 16, LEN_IN, LEN_OUT
    )
    assert min(o.tp * o.pp for o in options) == 16  # nothing smaller holds it
    tp16 = next(o for o in options if o.tp == 16)
    assert best.tokens_per_s > 1.5 * tp16.tokens_per_s  # cross-node TP all-reduces over 50 GB/s


def test_nothing_fits_returns_none():
    assert _best("meta-llama/Llama-3.1-405B", 2) is None


def test_pp_efficiency_falls_with_few_microbatches():
    model = load_model("meta-llama/Llama-3.1-8B")
    tokens = 16384.0

    def prefill_tokens_per_s(m):
        dep = with_parallelism(BASE, 1, 4, 1, microbatches=m)
        step = forward_step(System(model, H100, dep, EFF), prefill_tokens=tokens, prefill_seqs=8.0)
        return tokens / float(step.total_s)

    rates = [prefill_tokens_per_s(m) for m in (1, 2, 4, 8)]
    assert rates == sorted(rates)
    # compute-bound GPipe: iteration time ~ (m + p - 1) / (m p) of the whole batch's chain time,
    # so rate(m=1) / rate(m=8) = [(8 + 3) / 32] / [(1 + 3) / 4] = 11/32
    assert rates[0] / rates[3] == pytest.approx(11.0 / 32.0, rel=0.15)
