"""Tiny Qwen3 models (dense and MoE) made in the test, and the engine layouts they are held in,
computed with torch from the trainer's tensors (the oracle: torch.cat of q, k, v ..., narrowed
for the TP rank). The oracle is written here independently of the C mapping on purpose."""

from __future__ import annotations

import re
from typing import Dict

import torch

LAYERS = 2


def tiny_config(layout: str):
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    if layout == "dense":
        return Qwen3Config(intermediate_size=128, **common)
    return Qwen3MoeConfig(
        intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], **common
    )


def tiny_model(layout: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(layout)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def step(model: torch.nn.Module, k: int) -> Dict[str, torch.Tensor]:
    """'Training' step k: new values in every parameter (in place), returns the state_dict."""
    g = torch.Generator().manual_seed(1000 + k)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    return dict(model.state_dict())


def _rows(t: torch.Tensor, r: int, tp: int, dim: int = 0) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[r]


EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def engine_layout(sd: Dict[str, torch.Tensor], engine: str, r: int, tp: int) -> Dict[str, torch.Tensor]:
    """What engine rank r of tp holds, by engine parameter name."""
    from wsync.checkpoint import checkpoint_tensors

    sd = dict(checkpoint_tensors(sd))
    out: Dict[str, torch.Tensor] = {}
    experts: Dict[str, Dict[int, Dict[str, torch.Tensor]]] = {}
    w13, w2 = ("gate_up.weight", "down.weight") if engine == "lmdeploy" else ("w13_weight", "w2_weight")
    for name, t in sd.items():
        m = EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
            continue
        if name.endswith("self_attn.q_proj.weight"):
            base = name[: -len("q_proj.weight")]
            q, k, v = (sd[base + f"{x}_proj.weight"] for x in "qkv")
            out[base + "qkv_proj.weight"] = torch.cat([_rows(q, r, tp), _rows(k, r, tp), _rows(v, r, tp)])
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue
        elif name.endswith("mlp.gate_proj.weight"):
            base = name[: -len("gate_proj.weight")]
            out[base + "gate_up_proj.weight"] = torch.cat(
                [_rows(t, r, tp), _rows(sd[base + "up_proj.weight"], r, tp)]
            )
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = _rows(t, r, tp, dim=1)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            out[name] = _rows(t, r, tp)
        else:
            out[name] = t
    for base, by_e in experts.items():
        n = len(by_e)
        out[f"{base}.{w13}"] = torch.stack(
            [torch.cat([_rows(by_e[e]["gate_proj"], r, tp), _rows(by_e[e]["up_proj"], r, tp)]) for e in range(n)]
        )
        out[f"{base}.{w2}"] = torch.stack([_rows(by_e[e]["down_proj"], r, tp, dim=1) for e in range(n)])
    return {k: v.contiguous().clone() for k, v in out.items()}


def zeros_like_layout(layout: Dict[str, torch.Tensor], device: str = "cpu") -> Dict[str, torch.Tensor]:
    return {k: torch.zeros(v.shape, dtype=v.dtype, device=device) for k, v in layout.items()}
