"""Workload pytree, lognormal lengths, arrival sampling, trace loading and its error messages."""

import numpy as np
import pytest

from perfmodel import CatalogError
from perfmodel.dynamics import (
    PRESETS,
    Workload,
    load_trace,
    lognormal_params,
    sample_arrivals,
    sample_lengths,
    workload_from_trace,
)


def test_lognormal_params_reproduce_mean_and_cv():
    mu, sigma = lognormal_params(1000.0, 2.0)
    # E[X] = exp(mu + sigma^2 / 2), CV^2 = exp(sigma^2) - 1 (Johnson, Kotz & Balakrishnan)
    assert float(np.exp(mu + sigma**2 / 2)) == pytest.approx(1000.0)
    assert float(np.sqrt(np.exp(sigma**2) - 1)) == pytest.approx(2.0)


def test_sampled_lengths_and_gaps_match_moments():
    rng = np.random.default_rng(1)
    x = sample_lengths(rng, 500.0, 0.8, 200_000)
    assert x.min() >= 1 and x.dtype == np.int64
    assert x.mean() == pytest.approx(500.0, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.8, rel=0.03)
    t = sample_arrivals(rng, 4.0, 2.0, 200_000)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.02)  # rate 4 per second
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)


def test_deterministic_arrivals_when_cv_zero():
    t = sample_arrivals(np.random.default_rng(0), 2.0, 0.0, 5)
    np.testing.assert_allclose(t, [0.0, 0.5, 1.0, 1.5, 2.0])


# request counts from ../shared/data/README.md ("traces/" table)
@pytest.mark.parametrize(
    "name, rows, timed",
    [
        ("azure-code", 8819, True),
        ("azure-conv", 19366, True),
        ("sharegpt", 30731, False),
        ("arxiv", 28257, False),
    ],
)
def test_presets_load_every_row(name, rows, timed):
    trace = load_trace(name)
    assert len(trace) == rows
    assert trace.has_arrivals == timed
    assert (trace.prompt_tokens >= 1).all() and (trace.output_tokens >= 1).all()
    if timed:
        assert np.all(np.diff(trace.arrival_s) >= 0) and trace.arrival_s[0] == 0.0


def test_azure_conv_moments_match_the_data_readme():
    # ../shared/data/README.md: "mean prompt 1155 / output 211 tokens"; one hour of arrivals
    w = workload_from_trace(load_trace("azure-conv"))
    assert float(w.prompt_tokens_mean) == pytest.approx(1155, rel=0.01)
    assert float(w.output_tokens_mean) == pytest.approx(211, rel=0.01)
    assert float(w.arrival_rate_per_s) == pytest.approx(19366 / 3600, rel=0.05)
    assert float(w.interarrival_cv) > 1.0  # production arrivals are burstier than Poisson


def test_length_only_trace_needs_a_rate():
    trace = load_trace("sharegpt")
    with pytest.raises(CatalogError, match="--rate"):
        workload_from_trace(trace)
    w = workload_from_trace(trace, arrival_rate_per_s=3.0)
    assert float(w.arrival_rate_per_s) == 3.0 and float(w.interarrival_cv) == 1.0


def test_user_csv_same_columns(tmp_path):
    p = tmp_path / "mine.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n30,7\n")
    t = load_trace(p)
    np.testing.assert_array_equal(t.prompt_tokens, [10, 30])
    np.testing.assert_array_equal(t.output_tokens, [5, 7])


@pytest.mark.parametrize(
    "text, match",
    [
        ("a,b\n1,2\n", r"mine\.csv:1: missing columns"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.5,10,x\n",
            r"mine\.csv:2: column GeneratedTokens: cannot read 'x'",
        ),
        (
            (
                "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,10,2\n"
                "2023-11-16 18:00:00,10,2\n"
            ),
            r"mine\.csv:3: column TIMESTAMP: timestamps go backwards",
        ),
        ("num_prefill_tokens,num_decode_tokens\n-4,2\n", r"mine\.csv:2: column num_prefill_tokens"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n",
            r"mine\.csv:2: column TIMESTAMP",
        ),
    ],
)
def test_malformed_trace_names_file_line_and_column(tmp_path, text, match):
    p = tmp_path / "mine.csv"
    p.write_text(text)
    with pytest.raises(CatalogError, match=match):
        load_trace(p)


def test_unknown_trace_lists_presets():
    with pytest.raises(CatalogError, match=", ".join(PRESETS)):
        load_trace("no-such-trace")


def test_workload_is_a_pytree_of_arrays():
    import jax

    leaves = jax.tree_util.tree_leaves(Workload(arrival_rate_per_s=2.0))
    assert len(leaves) == 8


def test_rescale_arrivals_stretches_every_gap_by_one_factor():
    """Four requests over 3 s (1 req/s) rescaled to 2 req/s: gaps of 0.5 s, shape kept."""
    from perfmodel.dynamics import Trace, rescale_arrivals

    bursty = Trace([0.0, 0.5, 1.0, 3.0], [10, 20, 30, 40], [1, 2, 3, 4], "t")
    out = rescale_arrivals(bursty, 2.0)
    # n - 1 = 3 gaps over 3 s -> factor 3 / (2 * 3) = 0.5
    np.testing.assert_allclose(out.arrival_s, [0.0, 0.25, 0.5, 1.5])
    np.testing.assert_array_equal(out.prompt_tokens, bursty.prompt_tokens)
    same = Trace([2.0, 2.0], [1, 1], [1, 1])
    np.testing.assert_array_equal(rescale_arrivals(same, 5.0).arrival_s, [2.0, 2.0])


def test_poisson_arrivals_start_at_zero_with_mean_gap_one_over_rate():
    from perfmodel.dynamics import Trace, poisson_arrivals

    n = 20_000
    lengths = Trace(np.full(n, np.nan), np.ones(n, int), np.ones(n, int))
    out = poisson_arrivals(lengths, 4.0, seed=0)
    gaps = np.diff(out.arrival_s)
    assert out.arrival_s[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # exponential: mean 1/rate ...
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # ... and CV 1
