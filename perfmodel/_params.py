"""Parameter counts and layer structure read off a Hugging Face ``config.json``.

Counts include embeddings, the LM head unless tied, norms, attention biases (Qwen2) and QK-norms
(Qwen3), routers and shared experts; they reproduce the published sizes (Llama-3.1-8B 8.03 B,
Mixtral-8x7B 46.7 B total / 12.9 B active, DeepSeek-V3 671 B / 37.6 B).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_UNGATED_MLP = {"phi", "gpt2", "gptj", "gpt_neox", "bloom", "falcon", "opt"}
"""Model types whose MLP is up -> activation -> down (two matrices) instead of gated (three)."""


@dataclass(frozen=True)
class LayerCounts:
    """Plain-number summary of one architecture, the input to ``ModelSpec``."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    mla_kv_dim: int
    num_full_attention_layers: int
    num_window_layers: int
    window_tokens: int
    vocab_size: int
    total_params: float
    active_params: float
    embedding_params: float
    lm_head_params: float
    num_experts: int
    experts_per_token: int
    num_moe_layers: int
    expert_params: float
    attention_params: float
    output_projection_params: float
    dense_mlp_params: float
    shared_expert_params: float
    mlp_matrices: int


_REQUIRED = object()


def _get(cfg: dict[str, Any], *keys: str, default: Any = _REQUIRED) -> Any:
    """First present key among ``keys``; ``KeyError(keys[0])`` if none and no default."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is _REQUIRED:
        raise KeyError(keys[0])
    return default


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Llama-4, Qwen3.5, Kimi-K2.5) nest the language model's keys."""
    inner = cfg.get("text_config")
    if isinstance(inner, dict) and "hidden_size" in inner:
        merged = dict(inner)
        merged.setdefault("model_type", cfg.get("model_type"))
        return merged
    return cfg


def layer_counts(cfg: dict[str, Any]) -> LayerCounts:
    """Count parameters and classify attention layers from a ``config.json`` dict.

    Raises:
        KeyError: a required key (``hidden_size``, ``num_hidden_layers``, ...) is missing.
    """
    cfg = text_config(cfg)
    mt = str(cfg.get("model_type", ""))
    d = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    n_layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", "num_kv_heads", default=heads))
    vocab = int(_get(cfg, "vocab_size"))
    head_dim = int(_get(cfg, "head_dim", default=d // heads))
    tied = bool(cfg.get("tie_word_embeddings", mt.startswith("gemma")))

    # --- attention parameters per layer -------------------------------------------------
    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora:
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        v_dim = int(cfg["v_head_dim"])
        q_lora = cfg.get("q_lora_rank")
        qk = nope + rope
        q = d * q_lora + q_lora + q_lora * heads * qk if q_lora else d * heads * qk
        kv = d * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        o_proj = heads * v_dim * d
        attn = q + kv + o_proj
        head_dim, v_head_dim, mla_kv_dim = qk, v_dim, int(kv_lora) + rope
        kv_heads = heads
    else:
        v_head_dim, mla_kv_dim = head_dim, 0
        o_proj = heads * head_dim * d
        attn = d * heads * head_dim + 2 * d * kv_heads * head_dim + o_proj
        if mt == "qwen2" or cfg.get("attention_bias") or cfg.get("qkv_bias"):
            attn += heads * head_dim + 2 * kv_heads * head_dim
        if mt.startswith("qwen3") or cfg.get("use_qk_norm"):
            attn += 2 * head_dim
        if cfg.get("attention_bias") or mt == "phi":
            attn += d  # output-projection bias
    norms = 2 * d

    # --- MLP / MoE -----------------------------------------------------------------------
    gated = mt not in _UNGATED_MLP
    mats = 3 if gated else 2
    inter = int(_get(cfg, "intermediate_size", "n_inner", "ffn_hidden_size", default=4 * d))
    n_experts = int(_get(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0))
    top_k = int(_get(cfg, "num_experts_per_tok", "experts_per_token", default=0))
    dense_mlp = mats * d * inter + (inter + d if mt == "phi" else 0)
    n_moe = 0
    expert = 0.0
    moe_layer_params = 0.0
    moe_active = 0.0
    if n_experts > 0:
        moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
        expert = float(mats * d * moe_inter)
        shared = int(cfg.get("n_shared_experts") or 0) * mats * d * moe_inter
        shared_inter = cfg.get("shared_expert_intermediate_size") or 0
        shared += mats * d * int(shared_inter)
        if mt.startswith("llama4"):
            shared += mats * d * inter  # Llama-4 has one shared expert of intermediate_size
            step = int(cfg.get("interleave_moe_layer_step", 1))
            n_moe = n_layers // step
            dense_mlp = mats * d * int(cfg.get("intermediate_size_mlp", inter))
        else:
            first_dense = int(cfg.get("first_k_dense_replace", 0))
            freq = int(cfg.get("moe_layer_freq", 1) or 1)
            n_moe = len([i for i in range(first_dense, n_layers) if (i - first_dense) % freq == 0])
        router = d * n_experts
        if mt == "gpt_oss":  # biased experts and router
            expert += 2 * moe_inter + d
            router += n_experts
        moe_layer_params = n_experts * expert + shared + router
        moe_active = top_k * expert + shared + router
    n_dense = n_layers - n_moe

    embed = float(vocab * d)
    lm_head = 0.0 if tied else float(vocab * d)
    final_norm = d
    base = embed + lm_head + final_norm + n_layers * (attn + norms) + n_dense * dense_mlp
    total = base + n_moe * moe_layer_params
    active = base + n_moe * moe_active

    # --- attention layer kinds --------------------------------------------------------------
    layer_types = cfg.get("layer_types")
    window = int(_get(cfg, "sliding_window", "attention_chunk_size", default=0) or 0)
    if isinstance(layer_types, list) and layer_types:
        full = sum(1 for t in layer_types if t in ("full_attention", "attention"))
        win = sum(1 for t in layer_types if "sliding" in t or "chunk" in t)
    elif mt == "gemma2":
        full, win = n_layers - n_layers // 2, n_layers // 2  # alternating local/global
    elif mt.startswith("llama4") and cfg.get("attention_chunk_size"):
        win = n_layers - n_layers // 4  # chunked attention in 3 of every 4 layers
        full = n_layers - win
    elif window and cfg.get("use_sliding_window", True) and mt in ("mistral", "phi3"):
        full, win = 0, n_layers
    else:
        full, win = n_layers, 0
    if win == 0:
        window = 0

    return LayerCounts(
        num_layers=n_layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        mla_kv_dim=mla_kv_dim,
        num_full_attention_layers=full,
        num_window_layers=win,
        window_tokens=window,
        vocab_size=vocab,
        total_params=float(total),
        active_params=float(active),
        embedding_params=embed,
        lm_head_params=float(vocab * d),
        num_experts=n_experts,
        experts_per_token=top_k,
        num_moe_layers=n_moe,
        expert_params=expert,
        attention_params=float(attn),
        output_projection_params=float(o_proj),
        dense_mlp_params=float(dense_mlp),
        shared_expert_params=float(moe_active - top_k * expert) if n_experts > 0 else 0.0,
        mlp_matrices=mats,
    )
