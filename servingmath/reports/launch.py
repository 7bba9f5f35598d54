"""``optimize --emit DIR``: launch scripts and a Kubernetes manifest for the recommendation.

Everything comes from the ``--json`` object of ``servingmath optimize``: the engine commands are
its ``engine_args`` (built by ``optimize._engine_args`` from the flag tables in
``optimize/engine_flags/*.json``; nothing is added to them here), the replica and GPU counts are
its ``replicas`` / ``num_gpus`` (per pool under ``disaggregation`` for a prefill/decode split).

Files (``launch_files``):

* ``vllm.sh``, ``sglang.sh``, ``trtllm.sh``: bash scripts running one engine of the answer;
  for a split answer the first argument picks the pool (``prefill`` or ``decode``; TensorRT-LLM
  also ``router``, its disaggregated front end).
* ``deployment.yaml``: one ``apps/v1`` Deployment per pool (one when colocated, ``prefill`` and
  ``decode`` when split), as llm-d and NVIDIA Dynamo users deploy engines: ``replicas`` = the
  pool's engines, ``resources.limits`` ``nvidia.com/gpu`` = GPUs per engine (TP x PP), the
  container running the vLLM command (the table's launcher as ``command``, the rest as ``args``,
  environment assignments before it as ``env``) in the ``vllm/vllm-openai`` image of the flag
  table's vLLM version.
"""

from __future__ import annotations

import re
import shlex

from optimize import ENGINES, flag_table

from . import yaml_text
from .render import pools_text

SCRIPT_NAMES = {engine: f"{engine}.sh" for engine in ENGINES}
"""Launch script file per engine."""

MANIFEST_NAME = "deployment.yaml"
"""Kubernetes manifest file."""

VLLM_IMAGE = "vllm/vllm-openai"
"""vLLM's published OpenAI-server container image (tagged ``v<version>``)."""

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}

DNS_LABEL_CHARS = 63
"""Longest Kubernetes label value / DNS-1123 label (RFC 1123)."""

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def launch_files(out: dict) -> dict[str, str]:
    """``{file name: text}`` of the scripts and the manifest for a feasible ``optimize --json``
    object ``out``; ``ValueError`` when ``out`` is infeasible (there is nothing to launch)."""
    if not out.get("feasible") or not out.get("engine_args"):
        raise ValueError("an infeasible answer has no launch commands")
    files = {SCRIPT_NAMES[e]: engine_script(out, e) for e in ENGINES}
    files[MANIFEST_NAME] = manifest(out)
    return files


def pools(out: dict) -> list[tuple[str | None, dict]]:
    """``(role, pool)`` of each engine pool: ``[(None, out)]`` colocated, else the prefill and
    decode pools of ``out["disaggregation"]`` (each with ``gpu``, ``replicas``, ``num_gpus``)."""
    d = out.get("disaggregation")
    if not d:
        return [(None, out)]
    return [(role, d[role]) for role in ("prefill", "decode")]


def gpus_per_engine(pool: dict) -> int:
    """GPUs one engine of ``pool`` holds: its ``num_gpus`` over its ``replicas`` (TP x PP)."""
    return int(pool["num_gpus"]) // int(pool["replicas"])


def engine_script(out: dict, engine: str) -> str:
    """Bash script running ``engine``'s command of ``out["engine_args"]`` (one engine)."""
    e = out["engine_args"]
    head = [
        "#!/usr/bin/env bash",
        f"# {ENGINE_NAMES[engine]} {flag_table(engine)['version']}: {_summary(out)}",
        (
            f"# the command is engine_args.{engine} of `servingmath optimize --json` (flags from "
            f"optimize/engine_flags/{engine}.json)"
        ),
    ]
    for role, pool in pools(out):
        where = f"{role} pool: " if role else ""
        head.append(
            f"# {where}run {pool['replicas']} engine(s), each on {gpus_per_engine(pool)} "
            f"{pool['gpu']} GPU(s), behind a load balancer"
        )
    if e.get("notes"):
        head.append("# notes: " + _one_line(e["notes"]))
    head.append("set -euo pipefail")
    if not out.get("disaggregation"):
        return "\n".join([*head, e[engine]]) + "\n"
    roles = {"prefill": e[f"{engine}_prefill"], "decode": e[f"{engine}_decode"]}
    if engine == "trtllm" and e.get("trtllm_router"):
        roles["router"] = e["trtllm_router"]
    usage = "|".join(roles)
    head.insert(1, f"# usage: {engine}.sh {usage}")
    body = ['case "${1:-}" in']
    for role, command in roles.items():
        body += [f"  {role})", f"    {command}", "    ;;"]
    body += ["  *)", f'    echo "usage: $0 {usage}" >&2', "    exit 2", "    ;;", "esac"]
    return "\n".join(head + body) + "\n"


def manifest(out: dict) -> str:
    """The Kubernetes manifest: one ``apps/v1`` Deployment per pool, ``---``-separated."""
    base = _dns_label(_model_of(out))
    docs = []
    for role, pool in pools(out):
        command = out["engine_args"][f"vllm_{role}"] if role else out["engine_args"]["vllm"]
        comment = (
            f"# {role or 'engine'} pool: {pool['replicas']} x {gpus_per_engine(pool)} "
            f"{pool['gpu']} GPU(s); schedule it on {pool['gpu']} nodes (add a nodeSelector on "
            "your cluster's GPU product label, e.g. nvidia.com/gpu.product from GPU feature "
            "discovery)"
        )
        docs.append(comment + "\n" + yaml_text.dump(deployment(base, role, pool, command)))
    header = (
        f"# servingmath optimize: {_summary(out)}\n"
        f"# cost {out['cost_per_hour']} $/hour; apply with: kubectl apply -f {MANIFEST_NAME}\n"
    )
    return header + "---\n".join(docs)


def deployment(base: str, role: str | None, pool: dict, command: str) -> dict:
    """One Deployment: ``pool["replicas"]`` pods, each one vLLM engine (``command``, a vLLM
    launch line of ``engine_args``) holding ``gpus_per_engine(pool)`` GPUs."""
    env, argv = split_command(command)
    launcher = flag_table("vllm")["launcher"]
    if argv[: len(launcher)] != launcher:
        raise ValueError(f"not a vLLM launch command: {command!r}")
    component = role or "engine"
    labels = {"app.kubernetes.io/name": base, "app.kubernetes.io/component": component}
    container: dict = {
        "name": "vllm",
        "image": f"{VLLM_IMAGE}:v{flag_table('vllm')['version']}",
        "command": list(launcher),
        "args": argv[len(launcher) :],
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if "--port" in argv:
        container["ports"] = [{"containerPort": int(argv[argv.index("--port") + 1])}]
    container["resources"] = {"limits": {"nvidia.com/gpu": gpus_per_engine(pool)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": _dns_label(f"{base}-{component}"), "labels": dict(labels)},
        "spec": {
            "replicas": int(pool["replicas"]),
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": {**labels, "servingmath/gpu": _dns_label(pool["gpu"])}},
                "spec": {"containers": [container]},
            },
        },
    }


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    """``("K=V ... prog args")`` -> ({K: V}, [prog, args...]) with shell quoting undone."""
    words = shlex.split(command)
    env = {}
    while words and _ENV.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def _model_of(out: dict) -> str:
    """The served model id: the word after the launcher in the vLLM command."""
    command = out["engine_args"].get("vllm_decode") or out["engine_args"]["vllm"]
    _, argv = split_command(command)
    return argv[len(flag_table("vllm")["launcher"])]


def _dns_label(text: str) -> str:
    """``text`` as an RFC 1123 label: lower case, [a-z0-9-], at most 63 characters, the last
    path component of a Hugging Face id (``meta-llama/Llama-3.1-8B`` -> ``llama-3-1-8b``)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.rsplit("/", 1)[-1].lower()).strip("-")
    return label[:DNS_LABEL_CHARS].rstrip("-") or "model"


def _summary(out: dict) -> str:
    text = f"{out['replicas']} x {out['gpu']} (TP {out['tp']}, PP {out['pp']}) = {out['num_gpus']} GPUs"
    if out.get("disaggregation"):
        text = pools_text(out)
    return f"{text}, weights {out['weight_dtype']}, KV {out['kv_dtype']}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
