"""Parallelism choices: the rule of thumb (one GPU -> replicas, one node -> TP, several nodes ->
PP) emerges from comparing the budgets; PP efficiency falls with few microbatches; MoE expert
parallelism pays an all-to-all that grows with the batch."""

import pytest

from perfmodel import Deployment, Efficiency, forward_step, load_hardware, load_model
from perfmodel._expert import all_to_all_s, ep_decode_step
from perfmodel._parallel_choice import best_parallelism, parallelism_options, with_parallelism

H100 = load_hardware("h100-sxm")
EFF = Efficiency()
BASE = Deployment.create()
LEN_IN, LEN_OUT = 2000.0, 500.0


def _best(name, gpus):
    return best_parallelism(load_model(name), H100, BASE, EFF, gpus, LEN_IN, LEN_OUT)


def test_a_model_that_fits_one_gpu_runs_as_replicas():
    best = _best("meta-llama/Llama-3.1-8B", 8)
    assert (best.tp, best.pp, best.replicas) == (1, 1, 8)


def test_a_model_that_fits_one_node_uses_tp_not_pp():
    best = _best("meta-llama/Llama-3.1-70B", 8)
    assert best.tp > 1 and best.pp == 1 and not best.spans_nodes
    options = parallelism_options(
        load_model("meta-llama/Llama-3.1-70B"), H100, BASE, EFF, 8, LEN_IN, LEN_OUT
    )
    tp8 = next(o for o in options if (o.tp, o.pp) == (8, 1))
    pp8 = next(o for o in options if (o.tp, o.pp) == (1, 8))
    assert tp8.tokens_per_s > 3.0 * pp8.tokens_per_s and tp8.tpot_s_batch1 < pp8.tpot_s_batch1


def test_a_model_that_spans_nodes_uses_pp_across_and_tp_within():
    best = _best("meta-llama/Llama-3.1-405B", 16)  # 810 GB of bf16 weights > 8 x 80 GB
    assert best.spans_nodes and best.tp == int(H100.gpus_per_node) and best.pp == 2
    options = parallelism_options(
        load_model("meta-llama/Llama-3.1-405B"), H100, BASE, EFF, 16, LEN_IN, LEN_OUT
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
        step = forward_step(model, H100, dep, EFF, prefill_tokens=tokens, prefill_seqs=8.0)
        return tokens / float(step.total_s)

    rates = [prefill_tokens_per_s(m) for m in (1, 2, 4, 8)]
    assert rates == sorted(rates)
    # compute-bound GPipe: iteration time ~ (m + p - 1) / (m p) of the whole batch's chain time,
    # so rate(m=1) / rate(m=8) = [(8 + 3) / 32] / [(1 + 3) / 4] = 11/32
    assert rates[0] / rates[3] == pytest.approx(11.0 / 32.0, rel=0.15)


def test_all_to_all_anchor_and_ep1_is_free():
    # 64 tokens * 7168 * 2 B * 7/8 over 450 GB/s * 0.8, plus 7 hops * 5 us
    expect = 64 * 7168 * 2 * 7 / 8 / (450e9 * 0.8) + 7 * 5e-6
    assert float(all_to_all_s(64.0, 7168.0, 2.0, 8.0, 450e9, EFF)) == pytest.approx(expect)
    assert float(all_to_all_s(64.0, 7168.0, 2.0, 1.0, 450e9, EFF)) == 0.0


def test_ep_all_to_all_grows_with_batch_and_jumps_across_nodes():
    v3 = load_model("deepseek-ai/DeepSeek-V3")
    dep = Deployment.create(weight_dtype="fp8")
    small = ep_decode_step(v3, H100, dep, EFF, 64.0 * 8, 4000.0, 8.0)
    large = ep_decode_step(v3, H100, dep, EFF, 1024.0 * 8, 4000.0, 8.0)
    assert float(large.comm_s) > 4.0 * float(small.comm_s)
    inside = ep_decode_step(v3, H100, dep, EFF, 256.0 * 8, 4000.0, 8.0)
    across = ep_decode_step(v3, H100, dep, EFF, 256.0 * 16, 4000.0, 16.0)
    assert float(across.comm_s) > 5.0 * float(inside.comm_s)  # 50 GB/s NIC vs 450 GB/s NVLink
    assert float(across.memory_s) < float(inside.memory_s)  # but each device holds fewer experts
