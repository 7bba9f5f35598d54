"""The CLI runs with the legacy CPU emitter unless the user's ``XLA_FLAGS`` says otherwise."""

import os
import subprocess
import sys

from servingmath import cli


def test_flags_are_added_once_and_a_users_choice_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    cli._set_xla_flags()
    cli._set_xla_flags()
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2",
        "--xla_cpu_use_fusion_emitters=false",
    ]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    cli._set_xla_flags()
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=true"


def test_a_command_starts_its_backend_with_the_flags():
    """XLA reads ``XLA_FLAGS`` when the backend starts; an unknown flag there aborts the process,
    so a command that computes something proves the added flag is a real one."""
    code = (
        "import os, sys; from servingmath import cli; "
        "rc = cli.main(['gpus', '--json']); "
        "import jax.numpy as jnp; jnp.ones(2).block_until_ready(); "
        "print(os.environ['XLA_FLAGS']); sys.exit(rc)"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip().splitlines()[-1] == cli.CPU_XLA_FLAGS
