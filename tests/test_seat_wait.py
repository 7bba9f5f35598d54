"""The running slots' seat wait: Halfin-Whitt's diffusion, and its restoring force weakening
towards the seats (``_running_count``) integrated as a nonlinear diffusion."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from perfmodel._queueing import diffusion_seat_wait
from perfmodel._running_count import STIFFNESS_NODES, Feedback, averaged_gain, running_stiffness


def _erlang_c(servers: int, load: float) -> float:
    """M/M/c probability of waiting (Erlang C), by the stable Erlang B recursion."""
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return servers * b / (servers - load * (1.0 - b))


@pytest.mark.parametrize("servers, load", [(100, 90.0), (400, 380.0), (1000, 950.0)])
def test_poisson_variance_is_halfin_whitt_close_to_erlang_c(servers, load):
    # M/M/c: V = n = lambda / mu (mu = 1); P(wait) within 10 % of Erlang C in the QED regime
    # (beta = (c - n) / sqrt(n) = 1-1.6; the limit is asymptotic: at c = 100, beta = 2 it is
    # 25 % low), E[W | wait] = 1 / (c mu - lambda) exactly
    p, w = diffusion_seat_wait(load, load, float(servers), load)
    assert float(p) == pytest.approx(_erlang_c(servers, load), rel=0.10)
    assert float(w) == pytest.approx(1.0 / (servers - load))


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0, 3.0])
def test_uniform_stiffness_reproduces_the_closed_form(beta):
    args = (100.0, 100.0, 100.0 + 10.0 * beta, 5.0)
    p0, w0 = diffusion_seat_wait(*args)
    p1, w1 = diffusion_seat_wait(*args, jnp.ones(STIFFNESS_NODES))
    assert float(p1) == pytest.approx(float(p0), rel=1e-3)
    assert float(w1) == pytest.approx(float(w0), rel=1e-12)


def _brute_force_p_wait(n, v, c, k_of_x):
    """P(N >= c) of the stationary density exp(-U), U'' = k / V (k = 1 below n), above c an
    exponential of rate (c - n) k_bar / V: on a fine grid, independently of the quadrature."""
    sd = np.sqrt(v)
    x = np.linspace(n - 12.0 * sd, c, 400_001)
    k = np.where(x < n, 1.0, k_of_x(x))
    dx = x[1] - x[0]
    # drift slope k -> force K(x) = int_n^x k, potential U = int_n^x K / V
    i_n = np.searchsorted(x, n)
    force = np.cumsum(k) * dx
    force -= force[i_n]
    u = np.cumsum(force) * dx / v
    u -= u[i_n]
    below = np.sum(np.exp(-u)) * dx
    k_bar = force[-1] / (c - n)
    above = np.exp(-u[-1]) * v / ((c - n) * k_bar)
    return above / (above + below)


@pytest.mark.parametrize("drop", [0.0, 0.3, 0.6, 0.85])
@pytest.mark.parametrize("beta", [1.0, 2.0, 3.0])
def test_weakening_force_against_the_stationary_density(drop, beta):
    # k falls linearly from 1 at n to 1 - drop at c
    n, v = 120.0, 900.0
    c = n + beta * np.sqrt(v)
    t = np.linspace(0.0, 1.0, STIFFNESS_NODES)
    p, w = diffusion_seat_wait(n, v, c, 4.0, jnp.asarray(1.0 - drop * t))
    expect = _brute_force_p_wait(n, v, c, lambda x: 1.0 - drop * (x - n) / (c - n))
    assert float(p) == pytest.approx(expect, rel=0.01)
    # the excess over c drains at the drift there: E[W | wait] = V / ((c - n) k_bar lambda)
    assert float(w) == pytest.approx(v / ((c - n) * (1.0 - drop / 2.0) * 4.0), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(
    beta=st.floats(0.3, 3.5),
    drop=st.floats(0.0, 0.8),
    more=st.floats(0.02, 0.15),
)
def test_a_weaker_force_fills_the_seats_more_often(beta, drop, more):
    t = jnp.linspace(0.0, 1.0, STIFFNESS_NODES)
    args = (100.0, 400.0, 100.0 + 20.0 * beta, 3.0)
    p_stiff, w_stiff = diffusion_seat_wait(*args, 1.0 - drop * t)
    p_weak, w_weak = diffusion_seat_wait(*args, 1.0 - (drop + more) * t)
    assert float(p_weak) > float(p_stiff)
    assert float(w_weak) > float(w_stiff)


def _stiffness(tau, n_d, tpot, gain, u, seats=256.0):
    return running_stiffness(
        tau, Feedback.at_mean(tau, n_d, tpot, gain, u, False, 0.95), n_d, seats
    )


def _averaged(tau, n_d, spread, tpot, gain, u=0.7):
    return averaged_gain(tau, Feedback.at_mean(tau, n_d, tpot, gain, u, False, 0.95), spread)


def test_stiffness_on_a_straight_roofline():
    # tau = a + b n, unchunked TPOT = tau / (1 - u): g(N) = b N / tau(N), and
    # k(N) / k(n) = (1 - g(N)) / (1 - g(n)) tau(n) / tau(N) = (tau(n) / tau(N))^2
    a, b, u, n_d = 0.010, 4e-5, 0.5, 150.0
    tau = lambda n: a + b * n
    k = _stiffness(tau, n_d, tau(n_d) / (1 - u), b * n_d / tau(n_d), u)
    x = n_d + (256.0 - n_d) * np.linspace(0.0, 1.0, STIFFNESS_NODES)
    np.testing.assert_allclose(np.asarray(k), (tau(n_d) / tau(x)) ** 2, rtol=1e-9)


def _kinked(a, b, d, kink):
    """max(a + b n, c0 + d n): memory-bound below ``kink``, compute-bound (slope d > b) above."""
    c0 = a + (b - d) * kink
    return lambda n: jnp.maximum(a + b * n, c0 + d * n)


def test_stiffness_drops_past_the_roofline_kink():
    # past the kink, tau = c0 + d N (c0 < a), g(N) = d N / tau(N), and
    # k(N) / k(n) = (c0 / tau(N)) / (a / tau(n)) * tau(n) / tau(N)
    a, b, d, u, n_d = 0.030, 7e-5, 1.66e-4, 0.7, 100.0
    tau = _kinked(a, b, d, 105.0)
    c0 = a + (b - d) * 105.0
    k = _stiffness(tau, n_d, tau(n_d) / (1 - u), b * n_d / tau(n_d), u)
    x = n_d + (256.0 - n_d) * np.linspace(0.0, 1.0, STIFFNESS_NODES)
    past = x > 105.0
    expect = c0 * tau(n_d) ** 2 / (a * np.asarray(tau(x)) ** 2)
    np.testing.assert_allclose(np.asarray(k)[past], expect[past], rtol=1e-9)
    # the force at the seats is well under the memory-bound line's (tau(n) / (a + b c))^2
    assert float(k[-1]) < 0.6 * (float(tau(n_d)) / (a + b * 256.0)) ** 2


def test_stiffness_is_differentiable():
    def p_wait(b):
        k = _stiffness(lambda n: 0.01 + b * n, 150.0, 0.05, 0.4, 0.5)
        return diffusion_seat_wait(150.0, 900.0, 256.0, 20.0, k)[0]

    g = jax.grad(p_wait)(4e-5)
    fd = (p_wait(4e-5 * 1.001) - p_wait(4e-5 * 0.999)) / (4e-5 * 0.002)
    assert float(g) == pytest.approx(float(fd), rel=1e-3)
    assert float(g) > 0.0  # a steeper roofline weakens the force: more waits


def test_averaged_gain_without_spread_is_the_point_gain():
    g_bar, excess = _averaged(_kinked(0.030, 7e-5, 1.66e-4, 105.0), 100.0, 0.0, 0.12, 0.2)
    assert float(g_bar) == pytest.approx(0.2, abs=1e-12)
    assert float(excess) == pytest.approx(0.0, abs=1e-15)


def test_jensen_excess_of_a_kink_at_the_mean():
    # tau = tau(n) + b (N - n) + (d - b) (N - n)^+ for a kink at n: E[tau(N)] - tau(n) =
    # (d - b) sd / sqrt(2 pi); the 8-node Gauss-Hermite rule puts E[Z^+] 5.4 % high (0.4204)
    b, d, n = 7e-5, 1.66e-4, 105.0
    g_bar, excess = _averaged(_kinked(0.030, b, d, n), n, 400.0, 0.12, 0.3)
    sd = 20.0 / (1.0 - float(g_bar))
    assert float(excess) == pytest.approx((d - b) * sd / np.sqrt(2 * np.pi), rel=0.06)
    # a straight roofline has none (a spread that stays above N = 0)
    _, straight = _averaged(lambda x: 0.03 + b * x, n, 100.0, 0.12, 0.3)
    assert abs(float(straight)) < 1e-15


def test_averaged_gain_rises_across_the_kink():
    # below the kink (memory-bound, g = b n / tau = 0.19 at n = 100) a spread reaching past it
    # (compute-bound, g ~ 0.5) raises the averaged gain; far below it, it barely moves
    b = 7e-5
    tau = _kinked(0.030, b, 1.66e-4, 105.0)
    for n, spread, rises in ((100.0, 400.0, True), (40.0, 4.0, False)):
        g = b * n / float(tau(n))
        g_bar, _ = _averaged(tau, n, spread, float(tau(n)) / 0.3, g)
        if rises:
            assert float(g_bar) > g + 0.1
        else:
            assert float(g_bar) == pytest.approx(g, abs=0.02)
