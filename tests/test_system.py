"""The ``System`` bundle: one pytree that ``vmap`` maps part-wise and ``jax.tree.map`` stacks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import perfmodel as pm
from perfmodel import System
from perfmodel._specs import without_names

MODEL = pm.load_model("meta-llama/Llama-3.1-8B")
H100, H200 = pm.load_hardware("h100-sxm"), pm.load_hardware("h200-sxm")
DEPLOYMENT = pm.Deployment.create(tp=1)


def _step_s(system: System) -> jax.Array:
    return pm.forward_step(
        system, prefill_tokens=512.0, prefill_seqs=1.0, decode_seqs=32.0, decode_context=1500.0
    ).total_s


def test_vmap_over_a_posterior_maps_only_the_efficiency_part():
    # in_axes is a System of None (shared) and 0 (one draw per row): the same times as one call
    # per draw, and the model, GPU and deployment are not copied per draw
    fractions = jnp.asarray([0.4, 0.6, 0.8])
    draws = jax.vmap(lambda f: pm.Efficiency(bandwidth_fraction=f))(fractions)
    system = System(MODEL, H100, DEPLOYMENT, draws)
    mapped = jax.vmap(_step_s, in_axes=(System(None, None, None, 0),))(system)
    one_by_one = [
        float(_step_s(System(MODEL, H100, DEPLOYMENT, pm.Efficiency(bandwidth_fraction=float(f)))))
        for f in fractions
    ]
    np.testing.assert_allclose(np.asarray(mapped), one_by_one, rtol=1e-6)
    # more of the bandwidth achieved: a decode-heavy step takes less time
    assert float(mapped[0]) > float(mapped[1]) > float(mapped[2])


def test_systems_of_two_gpus_stack_leaf_by_leaf_once_their_names_are_dropped():
    # the spec names are the only static fields: two named GPUs differ in tree structure, two
    # unnamed ones stack with jax.tree.map and map over the GPU axis
    h100, h200 = (System(MODEL, h, DEPLOYMENT, pm.Efficiency()) for h in (H100, H200))
    with pytest.raises(ValueError):
        jax.tree.map(lambda *x: jnp.stack(x), h100, h200)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *without_names((h100, h200)))
    mapped = jax.vmap(_step_s)(stacked)
    np.testing.assert_allclose(
        np.asarray(mapped), [float(_step_s(h100)), float(_step_s(h200))], rtol=1e-6
    )
    # H200: the same compute, 4.8 against 3.35 TB/s of HBM: the decode-heavy step is faster
    assert float(mapped[1]) < float(mapped[0])


def test_replacing_one_part_changes_only_what_reads_it():
    # doubling TP through dataclasses.replace halves the per-GPU weight read of a decode step
    base = System(MODEL, H100, DEPLOYMENT, pm.Efficiency())
    tp2 = dataclasses.replace(base, deployment=pm.Deployment.create(tp=2))
    assert tp2.model is base.model and tp2.hardware is base.hardware
    one, two = (pm.decode_step(s, batch_size=1.0, context_len=100.0).memory_s for s in (base, tp2))
    assert float(two) == pytest.approx(float(one) / 2.0, rel=0.02)
