"""Floors that keep the closed forms finite, and their gradients defined, at the edges of their
domain: no load, an idle engine, a law with no spread.  Each sits far below any value the physics
reaches in its unit, so it binds only where the unguarded expression would be 0 / 0 or log 0;
each is a normal number in float32 as well as float64 (float32's smallest normal is 1.2e-38), so
one floor serves either precision."""

POSITIVE_FLOOR = 1e-30
"""Denominator or log argument that is exactly 0 at no load or on an idle engine (a rate, a
time, a mean, a utilisation, in SI units)."""

COUNT_FLOOR = 1e-9
"""A count that divides or is tested for none (running seats, sequences, replicas, experts,
prefills per iteration, tokens): a billionth of one."""

TIME_FLOOR_S = 1e-12
"""A time that divides (an iteration period, a mean wait, an interval's width): a picosecond,
below any GPU step by nine orders of magnitude."""

RATE_FLOOR_PER_S = 1e-12
"""A completion rate that divides: one request in ~30,000 years."""

PROBABILITY_FLOOR = 1e-12
"""A probability (or a load rho) kept off 0 before a log, a power or a division."""

COUNT_VARIANCE_FLOOR = 1e-9
"""Smallest variance of a count of requests (requests^2) a standardisation divides by."""

LOG_SD_FLOOR = 1e-9
"""Smallest log-normal sigma a length law divides by (a fixed length: cv -> 0)."""

SHARE_FLOOR = 1e-9
"""A share of iterations or arrivals that divides a time spread over them (the iterations that
carry prefill, the arrivals that wait): a billionth of them, where per-event times stop meaning
anything."""

LOG_VARIANCE_FLOOR = 1e-24
"""The variance of a log-normal's log kept off 0 before its square root (a law with no spread:
fixed lengths, one service time): a log-sd of 1e-12."""
