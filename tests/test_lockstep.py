"""A prefill-first engine's closed loop at fixed lengths runs in lockstep (``_closed_loop``):
every cycle prefills the whole burst in prefill-only iterations, then decodes all of it."""

import equinox as eqx
import jax.numpy as jnp
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from fitting._groups import prefill_first
from perfmodel import Deployment, Efficiency, System, load_hardware, load_model
from perfmodel._step import forward_step
from perfmodel.dynamics import Workload, closed_loop_metrics

MODEL = load_model("meta-llama/Llama-3.1-8B")
GPU = load_hardware("h100-sxm")
EFF = Efficiency()
FIRST = Deployment.create(tp=1, prefill_first=1.0)
MIXED = Deployment.create(tp=1)


def _fixed(clients: float, prompt: float = 1024.0, output: float = 128.0) -> Workload:
    return Workload(concurrency=clients, prompt_tokens_mean=prompt, output_tokens_mean=output)


def test_lockstep_cycle_is_the_wave_then_the_decodes_by_hand():
    """64 clients x 1024 tokens = 65,536 prompt tokens: 8 prefill-only iterations of 8,192
    (the default budget), then 127 decode iterations of all 64 at context P + O / 2."""
    clients, prompt, output = 64.0, 1024.0, 128.0
    m = closed_loop_metrics(System(MODEL, GPU, FIRST, EFF), _fixed(clients, prompt, output))
    chunk = forward_step(
        System(MODEL, GPU, FIRST, EFF), prefill_tokens=8192.0, prefill_seqs=8.0
    ).total_s
    decode = forward_step(
        System(MODEL, GPU, FIRST, EFF), decode_seqs=clients, decode_context=prompt + output / 2
    ).total_s
    cycle = 8.0 * chunk + 127.0 * decode
    assert float(m.e2e_s[0]) == pytest.approx(float(cycle), rel=1e-9)
    assert [float(x) for x in m.e2e_s[1:]] == pytest.approx([float(cycle)] * 4, rel=1e-9)
    assert float(m.ttft_s[0]) == pytest.approx(float(4.5 * chunk), rel=1e-9)
    # p50 of TTFT uniform on [chunk, 8 chunk]
    assert float(m.ttft_s[1]) == pytest.approx(float(4.5 * chunk), rel=1e-6)
    assert float(m.tpot_s[0]) == pytest.approx(float(decode + 3.5 * chunk / 127.0), rel=1e-9)
    assert float(m.requests_per_s) == pytest.approx(float(clients / cycle), rel=1e-9)
    # every request: E2E = TTFT + (O - 1) TPOT, so the means too
    assert float(m.ttft_s[0] + 127.0 * m.tpot_s[0]) == pytest.approx(float(cycle), rel=1e-9)


def test_any_length_spread_or_a_mixing_engine_is_the_desynchronised_loop():
    spread = eqx.tree_at(lambda w: w.output_tokens_cv, _fixed(64.0), jnp.asarray(0.05))
    a = closed_loop_metrics(System(MODEL, GPU, FIRST, EFF), spread)
    b = closed_loop_metrics(System(MODEL, GPU, MIXED, EFF), spread)
    c = closed_loop_metrics(System(MODEL, GPU, MIXED, EFF), _fixed(64.0))
    for x, y in ((a.ttft_s, b.ttft_s), (a.tpot_s, b.tpot_s), (a.e2e_s, b.e2e_s)):
        assert [float(v) for v in x] == pytest.approx([float(v) for v in y], rel=1e-12)
    assert float(c.state.lockstep_share) == 0.0


def test_lockstep_ttft_is_the_waves_and_grows_with_the_clients_while_tpot_is_pure_decode():
    """A burst wave makes the mean TTFT grow about linearly with the clients past one budget,
    and well above the desynchronised loop's; the decode iterations carry no prompt, so TPOT is
    below the mixing engine's at the same load."""
    few, many = (
        closed_loop_metrics(System(MODEL, GPU, FIRST, EFF), _fixed(n)) for n in (16.0, 128.0)
    )
    assert float(many.ttft_s[0]) / float(few.ttft_s[0]) > 4.0
    mixed = closed_loop_metrics(System(MODEL, GPU, MIXED, EFF), _fixed(128.0))
    assert float(many.ttft_s[0]) > 3.0 * float(mixed.ttft_s[0])
    assert float(many.itl_s[3]) < float(mixed.tpot_s[0])


@settings(max_examples=12, deadline=None)
@given(st.floats(1.0, 256.0), st.floats(64.0, 8192.0), st.floats(2.0, 2048.0))
def test_lockstep_keeps_littles_law_and_ordered_percentiles(clients, prompt, output):
    """N = X E[E2E] over every client, those waiting for a seat included."""
    m = closed_loop_metrics(System(MODEL, GPU, FIRST, EFF), _fixed(clients, prompt, output))
    assert float(m.requests_per_s * m.e2e_s[0]) == pytest.approx(clients, rel=1e-6)
    for summary in (m.ttft_s, m.tpot_s, m.e2e_s):
        q = [float(x) for x in summary[1:]]
        assert q == sorted(q) and all(x > 0.0 for x in q)


@pytest.mark.parametrize(
    "engine, notes, expected",
    [
        ("sglang", "", 1.0),
        ("SGLang", "tp=2", 1.0),
        ("sglang", "enable_mixed_chunk=true", 0.0),
        ("vllm", "", 0.0),
        ("trtllm", "", 0.0),
    ],
)
def test_runs_are_prefill_first_on_sglang_unless_it_mixes_chunks(engine, notes, expected):
    assert prefill_first(pd.Series({"engine": engine, "notes": notes})) == expected


def _serving_row(engine: str, notes: str, metric: str = "ttft", concurrency=16.0) -> pd.Series:
    return pd.Series(
        {
            "scenario": "serving",
            "engine": engine,
            "notes": notes,
            "metric": metric,
            "concurrency": concurrency,
        }
    )


@pytest.mark.parametrize(
    "row, lockstep",
    [
        (_serving_row("sglang", "how=closed-loop, fixed ISL/OSL"), True),
        # InferenceMAX draws lengths uniform from 80 % of nominal
        (_serving_row("sglang", "uniform;len_def=nominal"), False),
        (_serving_row("vllm", ""), False),
        (_serving_row("sglang", "", concurrency=float("nan")), False),  # open loop
        # SGLang bench_serving's own files: fixed only at random_range_ratio 1
        (_serving_row("sglang", "tool=sglang;dataset_name=random;random_range_ratio=1.0"), True),
        (_serving_row("sglang", "tool=sglang;dataset_name=random;random_range_ratio=0.0"), False),
        (_serving_row("sglang", "tool=sglang;dataset_name=sharegpt"), False),
        (_serving_row("sglang", "tool=vllm;dataset_name=random"), False),
    ],
)
def test_lockstep_rows_pool_their_ttft_apart(row, lockstep):
    """A lockstep run's TTFT is the wave the model prices; a desynchronised loop's TTFT offset
    carries clustering it does not, so the two pool their offsets apart (TPOT stays together)."""
    from fitting._groups import noise_key

    expected = "serving:lockstep:ttft" if lockstep else None
    key = noise_key(row)
    assert (key == "serving:lockstep:ttft") == lockstep, key
    assert expected is None or noise_key(row.replace("ttft", "tpot")) == "serving:tpot"


def test_explain_prices_sglangs_fixed_length_loop_as_lockstep(capsys):
    """``explain --engine sglang --concurrency N`` at fixed lengths is a lockstep loop: its TTFT
    is the wave's (far above the same loop with a 10 % output spread) and its TTFT scale is the
    lockstep runs' fitted one, not the desynchronised loops'."""
    import json

    import numpy as np

    import fitting
    from servingmath.cli import main

    base = [
        "explain", "--model", "Qwen/Qwen3-32B", "--gpu", "h100-sxm", "--tp", "2",
        "--concurrency", "128", "--input-len", "1024", "--output-len", "128",
        "--engine", "sglang", "--draws", "16", "--json",
    ]  # fmt: skip

    def run(*extra):
        assert main([*base, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    fixed, spread = run(), run("--output-cv", "0.1")
    assert fixed["ttft_s"]["mean"] > 5.0 * spread["ttft_s"]["mean"]
    posterior = fitting.load_posterior(None)
    for lockstep, out in ((True, fixed), (False, spread)):
        e = fitting.efficiency_draws(posterior, "h100-sxm", 16, engine="sglang", lockstep=lockstep)
        expected = float(np.median(np.asarray(e.ttft_scale)))
        assert out["engine_scales"]["ttft"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("clients", [16, 64])
def test_the_simulator_prefilling_first_reproduces_the_lockstep_closed_form(clients):
    """The discrete-event engine with ``prefill_first`` (prompt chunks in iterations of their
    own, decodes waiting for them) at fixed lengths falls into the lockstep the closed form
    prices: mean TTFT, TPOT and E2E within 1 % (its first round is the same burst)."""
    from perfmodel.simulator import simulate

    w = Workload(
        concurrency=float(clients),
        prompt_tokens_mean=1024.0,
        output_tokens_mean=128.0,
        requests_per_client=10.0,
    )
    cf = closed_loop_metrics(System(MODEL, GPU, FIRST, EFF), w)
    r = simulate(
        System(MODEL, GPU, FIRST, EFF), w, num_requests=10 * clients, seed=0, concurrency=clients
    )
    for measured, closed in ((r.ttft_s, cf.ttft_s), (r.tpot_s, cf.tpot_s), (r.e2e_s, cf.e2e_s)):
        assert float(measured.mean()) == pytest.approx(float(closed[0]), rel=0.01)
