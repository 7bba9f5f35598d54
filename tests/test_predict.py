"""Row -> prediction (fitting._predict) equals the perfmodel budgets computed by hand."""

import dataclasses
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from _measurement_rows import measurement_row

import perfmodel
from fitting._predict import (
    SERVING_REASON,
    compiled_predict_log,
    default_params,
    predict_log,
    prepare,
)
from perfmodel import System
from perfmodel._ops import KernelEfficiency, collective_time_s, elementwise_time_s, gemm_time_s

EFF, KER = perfmodel.Efficiency(), KernelEfficiency()


row = measurement_row


def predicted(rows):
    table = pd.DataFrame(rows)
    prep = prepare(table)
    return prep, np.exp(np.asarray(predict_log(prep, default_params(prep.gpus))))


def test_vidur_gemm_dims_from_config_and_tp():
    h = perfmodel.load_hardware("h100-sxm")
    _prep, y = predicted(
        [
            row(
                source="vidur",
                engine="sarathi",
                gpu="h100-sxm",
                model="meta-llama/Llama-2-7b-hf",
                scenario="op",
                op="mlp_up_proj",
                num_tokens=4096,
                tp=2,
            ),
            row(
                source="vidur",
                engine="sarathi",
                gpu="h100-sxm",
                model="meta-llama/Meta-Llama-3-8B",
                scenario="op",
                op="attn_pre_proj",
                num_tokens=512,
                tp=4,
            ),
        ]
    )
    peak, bw = h.dense_flops_per_s[0], h.hbm_bytes_per_s
    up = gemm_time_s(4096, 2 * 11008 / 2, 4096, 2.0, peak, bw, EFF, KER)  # gated: gate+up fused
    qkv = gemm_time_s(512, (32 + 2 * 8) * 128 / 4, 4096, 2.0, peak, bw, EFF, KER)
    np.testing.assert_allclose(y, [up, qkv], rtol=1e-12)


def test_ungated_mlp_and_elementwise_bytes():
    a40 = perfmodel.load_hardware("a40")
    _prep, y = predicted(
        [
            row(
                source="vidur",
                gpu="a40",
                model="microsoft/phi-2",
                scenario="op",
                op="mlp_up_proj",
                num_tokens=64,
            ),
            row(
                source="vidur",
                gpu="a40",
                model="microsoft/phi-2",
                scenario="op",
                op="add",
                num_tokens=64,
            ),
        ]
    )
    up = gemm_time_s(64, 10240, 2560, 2.0, a40.dense_flops_per_s[0], a40.hbm_bytes_per_s, EFF, KER)
    add = elementwise_time_s(64 * 3 * 2560 * 2.0, a40.hbm_bytes_per_s, KER)  # read 2, write 1
    np.testing.assert_allclose(y, [up, add], rtol=1e-12)


def test_elementwise_time_adds_the_onchip_ceiling_in_series():
    """A 16 MiB RMSNorm stream on the A40 (696 GB/s): at eta 0.9 and a 1 TB/s on-chip rate,
    2^24 / (0.9 * 696e9) + 2^24 / 1e12 + 4 us = 26.78 + 16.78 + 4 = 47.56 us; the default rate
    (inf) leaves the HBM-only roofline."""
    ker = KernelEfficiency(
        launch_overhead_s=4e-6,
        elementwise_bandwidth_fraction=0.9,
        elementwise_onchip_bytes_per_s=1e12,
    )
    t = float(elementwise_time_s(2.0**24, 696e9, ker))
    assert t == pytest.approx(2.0**24 / (0.9 * 696e9) + 2.0**24 / 1e12 + 4e-6, rel=1e-12)
    assert t == pytest.approx(47.56e-6, abs=0.01e-6)
    hbm_only = KernelEfficiency(launch_overhead_s=4e-6, elementwise_bandwidth_fraction=0.9)
    assert float(elementwise_time_s(2.0**24, 696e9, hbm_only)) == pytest.approx(
        30.78e-6, abs=0.01e-6
    )


def test_aic_gemm_fp8_reads_notes_and_fp8_peak():
    h = perfmodel.load_hardware("h100-sxm")
    _, y = predicted(
        [
            row(
                source="aiconfigurator",
                engine="vllm",
                gpu="h100-sxm",
                scenario="op",
                op="gemm",
                num_tokens=1024,
                notes="m=1024;n=4096;k=8192;gemm_dtype=fp8;kernel=x",
            )
        ]
    )
    ref = gemm_time_s(
        1024, 4096, 8192, 1.0, h.dense_flops_per_s[1], h.hbm_bytes_per_s, EFF, KER, 1.0
    )
    np.testing.assert_allclose(y, [ref], rtol=1e-12)


def test_collective_cross_node_uses_internode_link():
    h = perfmodel.load_hardware("a100-sxm-80gb")
    _, y = predicted(
        [
            row(
                source="vidur",
                engine="nccl",
                gpu="a100-sxm-80gb",
                scenario="collective",
                op="all_reduce",
                num_gpus=4,
                message_bytes=2**24,
                notes="topology=a100_dgx;single-node",
            ),
            row(
                source="vidur",
                engine="nccl",
                gpu="a100-sxm-80gb",
                scenario="collective",
                op="send_recv",
                num_gpus=2,
                message_bytes=2**24,
                notes="topology=a100_dgx;cross-node",
            ),
        ]
    )
    inter = h.internode_bytes_per_s * KER.internode_bandwidth_fraction
    ref = [
        collective_time_s(0, 2**24, 4, h.link_bytes_per_s, EFF),
        collective_time_s(2, 2**24, 2, inter, EFF),
    ]
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_step_rows_use_prefill_and_decode_step():
    model = perfmodel.load_model("meta-llama/Llama-2-70b-hf")
    hw = perfmodel.load_hardware("a100-sxm-80gb")
    dep = perfmodel.Deployment.create(tp=4, weight_dtype="fp16", kv_dtype="fp16")
    common = {
        "source": "splitwise",
        "gpu": "a100-sxm-80gb",
        "model": "meta-llama/Llama-2-70b-hf",
        "tp": 4,
        "num_gpus": 4,
        "weight_dtype": "fp16",
        "batch_size": 8,
        "input_len": 512,
        "output_len": 128,
    }
    _, y = predicted(
        [
            row(scenario="prefill", **common),
            row(scenario="decode_step", **common),
            row(scenario="static_batch", metric="output_throughput", unit="tokens/s", **common),
        ]
    )
    pre = perfmodel.prefill_step(System(model, hw, dep, EFF), 512.0, 8.0).total_s
    dec = perfmodel.decode_step(System(model, hw, dep, EFF), 8.0, 512.0 + 64.0).total_s
    thr = 8 * 128 / (pre + 127 * dec)
    np.testing.assert_allclose(y, [pre, dec, thr], rtol=1e-10)


def test_uncovered_rows_are_skipped_with_reasons():
    """(The fit's path: serving rows are skipped there; ``validate`` predicts them.)"""
    prep = prepare(
        serving=False,
        table=pd.DataFrame(
            [
                row(
                    source="aic",
                    gpu="h100-sxm",
                    model="Qwen/Qwen3-32B",
                    scenario="serving",
                    metric="ttft",
                    concurrency=16,
                    input_len=1024,
                    output_len=128,
                ),
                row(
                    source="vidur",
                    gpu="tpu-v9",
                    scenario="collective",
                    op="all_reduce",
                    num_gpus=2,
                    message_bytes=1e6,
                    notes="cross-node",
                ),
                row(
                    source="vidur",
                    gpu="h100-sxm",
                    model="meta-llama/Llama-2-7b-hf",
                    scenario="op",
                    op="add",
                    num_tokens=8,
                ),
            ]
        ),
    )
    reasons = [r for _, r in prep.skipped]
    assert len(prep.log_value) == 1 and len(reasons) == 2
    assert reasons[0] == SERVING_REASON
    assert "tpu-v9" in reasons[1] and "unknown GPU" in reasons[1]


def test_prediction_is_differentiable_in_the_parameters():
    prep = prepare(
        pd.DataFrame(
            [
                row(
                    source="vidur",
                    gpu="h100-sxm",
                    model="meta-llama/Llama-2-7b-hf",
                    scenario="op",
                    op="mlp_down_proj",
                    num_tokens=n,
                )
                for n in (1, 256, 4096)
            ]
            + [
                row(
                    source="splitwise",
                    gpu="h100-sxm",
                    model="meta-llama/Llama-2-70b-hf",
                    scenario="decode_step",
                    tp=2,
                    num_gpus=2,
                    weight_dtype="fp16",
                    batch_size=4,
                    input_len=512,
                    output_len=64,
                )
            ]
        )
    )
    params = default_params(prep.gpus)
    g = jax.grad(lambda p: predict_log(prep, p).sum())(params)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(g))
    assert float(g.compute_fraction_max[0]) < 0.0  # more efficient -> faster
    assert float(g.bandwidth_fraction[0]) < 0.0
    # the rows as one compiled program (what the new-GPU update's NumPyro model reads, which
    # NumPyro also runs and differentiates outside any trace): the same value and gradient
    fast = compiled_predict_log(prep)
    np.testing.assert_allclose(fast(params), predict_log(prep, params), rtol=1e-12, atol=0.0)
    g_fast = jax.grad(lambda p: fast(p).sum())(params)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-300)


def test_collective_latency_is_per_call_plus_per_hop():
    """t = alpha_0 + hops * alpha + volume / (eta * link), by hand: ring all-reduce 2(p-1) hops,
    all-gather p-1, send/recv one."""
    eff = perfmodel.Efficiency(
        collective_latency_s=1e-6, collective_base_latency_s=5e-6, collective_bandwidth_fraction=0.5
    )
    n, link = 2.0**20, 450e9
    assert float(collective_time_s(0, n, 8, link, eff)) == pytest.approx(
        5e-6 + 14e-6 + 2 * 7 / 8 * n / (0.5 * link)
    )
    assert float(collective_time_s(1, n, 8, link, eff)) == pytest.approx(
        5e-6 + 7e-6 + 7 / 8 * n / (0.5 * link)
    )
    assert float(collective_time_s(2, n, 2, link, eff)) == pytest.approx(
        5e-6 + 1e-6 + n / (0.5 * link)
    )
    assert float(collective_time_s(0, n, 1, link, eff)) == 0.0


def test_sliding_window_decode_reads_only_the_window():
    notes = "num_heads=8;num_kv_heads=1;head_dim=128;window_size=128"
    rows = [
        row(
            source="aiconfigurator",
            engine="vllm",
            gpu="h100-sxm",
            scenario="op",
            op="attn_decode",
            batch_size=4,
            context_len=c,
            kv_dtype="bf16",
            notes=notes,
        )
        for c in (127, 65535)
    ]
    prep, _ = predicted(rows)
    b = prep.blocks.attention
    kv_bytes, q_bytes = 4 * 128 * 2 * 1 * 128 * 2, 4 * 2 * 8 * 128 * 2
    np.testing.assert_allclose(b.bytes_moved, [kv_bytes + q_bytes] * 2)
    np.testing.assert_allclose(b.flops, [4 * 128 * 2 * 2 * 8 * 128] * 2)


def test_vllm_graph_and_eager_all_reduce_get_their_own_latency_cells():
    rows = [
        row(
            source="aiconfigurator",
            engine="vllm",
            gpu="h100-sxm",
            scenario="collective",
            op="all_reduce",
            num_gpus=4,
            message_bytes=4096,
            notes=f"backend={b};kernel=vLLM_custom",
        )
        for b in ("vllm_graph", "vllm_eager")
    ]
    rows.append(
        row(
            source="aiconfigurator",
            engine="nccl",
            gpu="h100-sxm",
            scenario="collective",
            op="all_reduce",
            num_gpus=4,
            message_bytes=4096,
            notes="nccl-tests",
        )
    )
    prep, _ = predicted(rows)
    assert prep.cells == (
        "aiconfigurator:vllm_eager|collective:all_reduce",
        "aiconfigurator:vllm_graph|collective:all_reduce",
    )
    assert list(prep.cell_idx) == [1, 0, -1]  # nccl-tests anchor the latency: no offset


def test_gpu_group_draws_keep_fitted_pairs_and_widen_unseen_ones():
    """A fitted (GPU, group) pair returns its own draws; an unseen GPU or group draws
    N(0, tau_gpu) (kernel groups; whole-model and serving groups of an unseen GPU only); anchor
    groups and a fitted GPU's whole-model and serving groups get no GPU x group term."""
    import arviz as az

    from fitting._posterior import Posterior
    from fitting._predictive import gpu_group_draws

    n = 4000
    rng = np.random.default_rng(0)
    eta = np.stack([np.full((n, 2), 0.3), np.full((n, 2), -0.2)], axis=1)  # gpu x group
    post = Posterior(
        az.from_dict(
            posterior={
                "gpu_group": eta[None],
                "tau_gpu_kernel": np.full((1, n), 0.5),
            },
            coords={"gpu": ["a", "b"], "group": ["op:rope", "decode_step:time"]},
            dims={"gpu_group": ["gpu", "group"]},
        )
    )
    keys = ("op:rope", "decode_step:time", "serving:ttft", "op:activation", "op:norm")
    out = gpu_group_draws(post, ("b", "new"), keys, np.arange(n), rng)
    assert out.shape == (n, 2, 5)
    np.testing.assert_allclose(out[:, 0, 0], -0.2)  # fitted pair: its own draws
    np.testing.assert_allclose(out[:, 0, 1], -0.2)
    assert np.all(out[:, 0, 2] == 0.0)  # seen GPU, serving: its offsets pinned it
    assert abs(out[:, 1, 2].std() - 0.5) < 0.03  # unseen GPU, serving: tau_gpu
    assert abs(out[:, 1, 0].std() - 0.5) < 0.03  # unseen GPU, kernel group: tau_gpu_kernel
    assert abs(out[:, 1, 1].std() - 0.5) < 0.03  # unseen GPU, whole-model group: tau_gpu too
    assert abs(out[:, 0, 3].std() - 0.5) < 0.03  # seen GPU, unseen kernel group
    assert np.all(out[:, :, 4] == 0.0)  # anchor group (norm): its GPU's bandwidth carries it


@pytest.mark.parametrize(
    ("gpu", "gpus", "tp", "replicas"),
    [("h100-sxm", 8, 2, 4), ("h200-sxm", 8, 1, 8), ("h100-sxm", 1, 1, 1)],
)
def test_mlperf_row_without_dtype_or_tp_reads_as_the_fp8_throughput_recipe(gpu, gpus, tp, replicas):
    """An MLPerf row records neither its weight dtype (an empty cell, not a missing value) nor its
    TP: it is read as FP8 weights and FP8 KV (the v4.1 recipe, data README), at the smallest TP
    dividing the run's GPUs whose weights take at most half a GPU's memory (Llama-2-70B in FP8,
    69.0 GB: TP2 on an 85.9 GB H100, TP1 on a 151 GB H200; a 1-GPU run keeps TP1)."""
    from fitting._rows import _e2e_features

    r = pd.Series(
        row(
            source="mlperf-inference-v4.1",
            scenario="saturated",
            metric="output_throughput",
            stat="",
            model="meta-llama/Llama-2-70b-hf",
            gpu=gpu,
            num_gpus=gpus,
            tp=np.nan,
            pp=np.nan,
            weight_dtype="",
            kv_dtype="",
            input_len=np.nan,
            output_len=290.0,
            request_rate=np.inf,
            engine="trtllm",
            value=24000.0,
            unit="tokens/s",
        )
    )
    (_, _, dep), _ = _e2e_features(r)
    assert float(dep.weight_bytes_per_param) == 1.0 and float(dep.kv_bytes_per_elem) == 1.0
    assert float(dep.tp) == tp and float(dep.replicas) == replicas


@pytest.mark.parametrize(
    ("notes", "concurrency", "expected"),
    [
        ("num_prompts=10x concurrency (DeepSeek-R1 on b200: 20x if OSL 8192 else 50x)", 64, 10.0),
        ("num_prompts=500", 50, 10.0),  # a vllm bench serve total, shared by 50 clients
        ("num_prompts=8", 64, 1.0),  # fewer prompts than clients: each sends at most one
        ("burstiness=1.0", 16, 10.0),  # unrecorded: the benchmarks' default 10 x concurrency
        ("num_prompts=all", 16, 10.0),
    ],
)
def test_requests_per_client_reads_a_multiple_or_a_total(notes, concurrency, expected):
    """InferenceMAX notes give num_prompts as a multiple of the concurrency, a vLLM result file
    as the run's total, which the clients share."""
    import pandas as pd

    from fitting._rows import _requests_per_client

    row = pd.Series({"notes": notes, "concurrency": concurrency})
    assert _requests_per_client(row) == pytest.approx(expected)


def test_serving_runs_price_tp_all_reduce_at_the_engine_custom_all_reduce_latency():
    """A serving run's TP all-reduces are the CUDA-graph custom all-reduce: its rows point at
    ``ENGINE_ALL_REDUCE_CELL``, whose offset scales alpha and alpha_0 of every step of the load
    model (and nothing else): the prediction equals the one with those latencies scaled by hand,
    and a cheaper all-reduce makes a TP-8 closed loop strictly faster."""
    from fitting._names import ENGINE_ALL_REDUCE_CELL

    serving = row(
        source="lab",
        engine="vllm",
        gpu="h100-sxm",
        scenario="serving",
        model="meta-llama/Llama-3.1-70B",
        num_gpus=8,
        tp=8,
        weight_dtype="bf16",
        kv_dtype="bf16",
        input_len=1024.0,
        output_len=256.0,
        concurrency=8.0,
        request_rate=np.inf,
        metric="tpot",
        stat="mean",
        value=0.02,
    )
    prep = prepare(pd.DataFrame([serving]))
    j = prep.cells.index(ENGINE_ALL_REDUCE_CELL)
    assert list(prep.comm_idx) == [j]
    params = default_params(prep.gpus)
    at = jax.jit(lambda p, o: predict_log(prep, p, o)[0])  # one compile, three evaluations
    offsets = np.zeros(len(prep.cells))
    base = float(at(params, jnp.asarray(offsets)))
    offsets[j] = np.log(0.4)
    cheaper = float(at(params, jnp.asarray(offsets)))
    by_hand = dataclasses.replace(
        params,
        **{
            f: getattr(params, f) * 0.4
            for f in ("collective_latency_s", "collective_base_latency_s")
        },
    )
    expected = float(at(by_hand, jnp.zeros(len(prep.cells))))
    assert cheaper == pytest.approx(expected, rel=1e-9)
    assert cheaper < base


def test_an_unrecorded_mlperf_prompt_is_drawn_log_normal_around_its_median():
    """An MLPerf Offline row has no input length: its prediction at prompt_z = 0 is that of the
    same run with the median prompt (``MLPERF_PROMPT_TOKENS``) written in, and at z = +-1.645 that
    of the run with 4x / 0.25x the prompt (the 90 % range [64, 1024] tokens); a row that records
    its prompt ignores z.  Longer prompts cost more prefill: throughput falls."""
    from fitting._rows import MLPERF_PROMPT_TOKENS

    common = {
        "source": "mlperf-inference-v4.1",
        "engine": "trtllm",
        "gpu": "h100-sxm",
        "scenario": "saturated",
        "model": "meta-llama/Llama-2-70b-hf",
        "num_gpus": 8,
        "tp": 2,
        "weight_dtype": "fp8",
        "kv_dtype": "fp8",
        "output_len": 290.0,
        "request_rate": np.inf,
        "metric": "output_throughput",
        "stat": "",
        "unit": "tokens/s",
        "value": 24000.0,
    }
    prompts = (np.nan, MLPERF_PROMPT_TOKENS, 4 * MLPERF_PROMPT_TOKENS, MLPERF_PROMPT_TOKENS / 4)
    prep = prepare(pd.DataFrame([row(input_len=p, **common) for p in prompts]))
    params = default_params(prep.gpus)
    at = jax.jit(lambda z: predict_log(prep, params, None, z))  # one compile, three draws
    z95 = NormalDist().inv_cdf(0.95)
    median, long, short = (np.asarray(at(z)) for z in (0.0, z95, -z95))
    assert median[0] == pytest.approx(median[1], rel=1e-12)
    assert long[0] == pytest.approx(median[2], rel=1e-9)
    assert short[0] == pytest.approx(median[3], rel=1e-9)
    assert short[0] > median[0] > long[0]
    np.testing.assert_array_equal(long[1:], median[1:])  # recorded prompts ignore z


def test_an_unrecorded_prompt_keys_the_offset_cell_by_its_dataset():
    """MLPerf runs one dataset per model and records no prompt length, so an MLPerf end-to-end
    row's offset cell is its lab, dataset (model) and engine: Llama-2-70B's and Mixtral's runs
    get separate cells (their unknown prompt lengths are separate biases), the same lab and
    engine with a recorded prompt keeps the lab's cell, and another lab's rows never take the
    model into the key; only the unrecorded rows draw the prompt-length spread."""
    from fitting._groups import source_key
    from fitting._rows import MLPERF_PROMPT_LOG_SD, _lengths

    base = {"source": "mlperf-inference-v4.1", "engine": "trtllm", "scenario": "saturated"}
    base |= {"input_len": np.nan, "output_len": 290.0, "notes": ""}
    llama = pd.Series(base | {"model": "meta-llama/Llama-2-70b-hf"})
    mixtral = pd.Series(base | {"model": "mistralai/Mixtral-8x7B-v0.1"})
    recorded = pd.Series(base | {"model": "meta-llama/Llama-2-70b-hf", "input_len": 1024.0})
    other_lab = pd.Series(
        base | {"source": "inferencemax", "model": "openai/gpt-oss-120b", "input_len": np.nan}
    )
    kernel = pd.Series(base | {"scenario": "op", "model": "meta-llama/Llama-2-70b-hf"})
    assert source_key(llama) == "mlperf-inference-v4.1/Llama-2-70b-hf:trtllm"
    assert source_key(mixtral) == "mlperf-inference-v4.1/Mixtral-8x7B-v0.1:trtllm"
    assert source_key(recorded) == source_key(kernel) == "mlperf-inference-v4.1:trtllm"
    assert source_key(other_lab) == "inferencemax:trtllm"
    assert _lengths(llama)[4] == MLPERF_PROMPT_LOG_SD and _lengths(recorded)[4] == 0.0
    assert _lengths(other_lab)[4] == 0.0


@pytest.mark.parametrize(("concurrency", "rate"), [(np.nan, 5.0), (16.0, np.inf)])
def test_serving_stats_open_and_closed_loop_predict_p90_between_p50_and_p95(concurrency, rate):
    """Open-loop (request-rate) and closed-loop runs are predicted for mean, p50, p90, p95 and
    p99 alike, p50 <= p90 <= p95 <= p99; a max is skipped with a reason listing those stats."""
    common = {
        "source": "lab",
        "engine": "vllm",
        "gpu": "h100-sxm",
        "scenario": "serving",
        "model": "meta-llama/Llama-3.1-8B",
        "input_len": 1024.0,
        "output_len": 256.0,
        "concurrency": concurrency,
        "request_rate": rate,
        "metric": "ttft",
        "value": 0.1,
    }
    stats = ("p50", "p90", "p95", "p99", "max")
    prep = prepare(pd.DataFrame([row(stat=st, **common) for st in stats]))
    assert len(prep.log_value) == 4
    assert "serving runs are predicted for mean, median, p50, p90, p95, p99" in prep.skipped[0][1]
    values = np.exp(np.asarray(predict_log(prep, default_params(prep.gpus))))
    assert np.all(np.isfinite(values)) and np.all(np.diff(values) >= 0.0), values


LAB_RUN = {
    "source": "lab",
    "engine": "sglang",
    "gpu": "h100-sxm",
    "scenario": "serving",
    "model": "meta-llama/Llama-3.1-8B",
    "num_gpus": 1,
    "tp": 1,
    "weight_dtype": "bf16",
    "kv_dtype": "bf16",
    "input_len": 1024.0,
    "output_len": 256.0,
}
"""One SGLang serving run of Llama-3.1-8B on one H100 (1024/256 tokens), the rows below vary."""


def test_an_itl_row_is_the_gap_between_streamed_chunks():
    """A run that streams k tokens a chunk (notes ``stream_interval=k``) measures its ITL
    between chunks: k x the per-token ITL of the same run, while its TPOT is unchanged; a
    stream interval that is not a token count >= 1 is skipped with the reason."""
    common = LAB_RUN | {
        "concurrency": 16.0,
        "request_rate": np.inf,
        "stat": "mean",
        "value": 0.02,
    }
    rows = [
        row(metric="itl", notes="stream_interval=1", **common),
        row(metric="itl", notes="stream_interval=8", **common),
        row(metric="tpot", notes="stream_interval=8", **common),
        row(metric="itl", **common),  # unrecorded: one token a chunk
        row(metric="itl", notes="stream_interval=0", **common),
    ]
    prep, y = predicted(rows)
    assert len(y) == 4 and "stream_interval='0'" in prep.skipped[0][1]
    assert y[1] == pytest.approx(8.0 * y[0], rel=1e-12) and y[3] == pytest.approx(y[0], rel=1e-12)
    assert y[2] < y[1]  # TPOT is per token


def test_a_scheduler_that_polls_every_k_iterations_delays_ttft_and_e2e_by_half_of_k_minus_1():
    """An engine that looks for new requests every k forward iterations (notes
    ``scheduler_recv_interval=k``, SGLang's ``--scheduler-recv-interval``) keeps an arrival
    waiting (k - 1) / 2 iterations on average beyond the one it arrives in: TTFT and E2E grow by
    that many mean per-token gaps (TPOT), TPOT itself is unchanged; a setting that is not an
    iteration count >= 1 is skipped with the reason.  The lengths are drawn (InferenceMAX's
    notes), so the clients are desynchronised: a lockstep loop's burst finds the engine idle."""
    drawn = "uniform;len_def=nominal"
    common = LAB_RUN | {
        "concurrency": 16.0,
        "request_rate": np.inf,
        "stat": "mean",
        "value": 0.1,
    }
    rows = [
        row(metric="ttft", notes=drawn, **common),
        row(metric="ttft", notes=f"{drawn};scheduler_recv_interval=21", **common),
        row(metric="e2e_latency", notes=drawn, **common),
        row(metric="e2e_latency", notes=f"{drawn};scheduler_recv_interval=21", **common),
        row(metric="tpot", notes=drawn, **common),
        row(metric="tpot", notes=f"{drawn};scheduler_recv_interval=21", **common),
        row(metric="ttft", notes=f"{drawn};scheduler_recv_interval=0.5", **common),
    ]
    prep, y = predicted(rows)
    assert len(y) == 6 and "scheduler_recv_interval='0.5'" in prep.skipped[0][1]
    ttft, ttft_21, e2e, e2e_21, tpot, tpot_21 = y
    assert tpot_21 == pytest.approx(tpot, rel=1e-12)
    assert ttft_21 == pytest.approx(ttft + 10.0 * tpot, rel=1e-12)
    assert e2e_21 == pytest.approx(e2e + 10.0 * tpot, rel=1e-12)


def test_throughput_rows_read_no_poll_wait_even_where_latencies_are_not_finite():
    """An open loop offered more than the engine serves has no finite latency (its queue grows
    without bound) but a finite throughput; its throughput rows add no poll wait, so they stay
    finite with or without a poll setting (0 x inf is never formed)."""
    common = LAB_RUN | {
        "request_rate": 1000.0,
        "stat": "mean",
        "value": 10.0,
    }
    rows = [
        row(metric="ttft", **common),
        row(metric="output_throughput", **common),
        row(metric="output_throughput", notes="scheduler_recv_interval=21", **common),
    ]
    _prep, y = predicted(rows)
    assert len(y) == 3 and np.isinf(y[0])  # overloaded: no finite latency
    assert np.all(np.isfinite(y[1:])) and y[2] == y[1]


def test_inferencemax_scheduler_polls_follow_its_launch_scripts():
    """``INFERENCEMAX_SCHEDULER_POLLS``: SGLang's DeepSeek-R1 runs on B200 poll every 10
    iterations below 16 clients and every 30 from 16 on; its H200 runs and every vLLM and
    TensorRT-LLM run poll each iteration; a row's own note wins."""
    from fitting._rows import scheduler_poll_iterations

    base = {"source": "inferencemax", "engine": "sglang", "model": "deepseek-ai/DeepSeek-R1"}
    cases = [
        ({"gpu": "b200", "concurrency": 8.0}, 10.0),
        ({"gpu": "b200", "concurrency": 16.0}, 30.0),
        ({"gpu": "b200", "concurrency": 256.0}, 30.0),
        ({"gpu": "h200-sxm", "concurrency": 64.0}, 1.0),
        ({"gpu": "b200", "concurrency": 64.0, "engine": "vllm"}, 1.0),
        ({"gpu": "b200", "concurrency": 64.0, "source": "lab"}, 1.0),
        ({"gpu": "b200", "concurrency": 64.0, "notes": "scheduler_recv_interval=4"}, 4.0),
    ]
    for fields, polls in cases:
        assert scheduler_poll_iterations(pd.Series(base | fields)) == polls, fields


def test_inferencemax_stream_intervals_are_each_runs_itl_over_tpot():
    """InferenceMAX's launch-script stream intervals (``INFERENCEMAX_STREAM_TOKENS``) against
    its files: every run's mean ITL / mean TPOT is within 2.5 % of the tokens per chunk the rule
    gives it (vLLM 1, SGLang 10 or 30, TensorRT-LLM 20)."""
    from fitting._rows import stream_chunk_tokens
    from fitting.ingest import load_measurements

    table = load_measurements(["data/measurements/inferencemax_nvidia.csv.gz"]).table
    mean = table[(table["stat"] == "mean") & table["metric"].isin(["itl", "tpot"])].copy()
    mean["run"] = mean["notes"].str.extract(r"(gha_run_id=\d+; artifact_index=\d+)")[0]
    keys = ["run", "gpu", "model", "engine", "tp", "input_len", "output_len", "concurrency"]
    runs = mean.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    itl_rows = mean[mean["metric"] == "itl"]
    tokens = pd.Series(
        itl_rows.apply(stream_chunk_tokens, axis=1).to_numpy(),
        index=pd.MultiIndex.from_frame(itl_rows[keys]),
    )
    ratio = (runs["itl"] / runs["tpot"]).reindex(tokens.index)
    assert len(ratio) > 800 and set(tokens) == {1.0, 10.0, 20.0, 30.0}
    deviation = np.abs(ratio / tokens - 1.0)
    np.testing.assert_array_less(deviation, 0.025)  # largest: 2.1 % (a vLLM run)
