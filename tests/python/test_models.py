"""The model layer (models/wsync_model.h): the HF tensor list derived from a config equals, name
for name, dtype and shape, the state_dict of the transformers model built from that config, for
Llama, Mistral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE and Mixtral, with and without tied embeddings;
an unknown model_type is refused naming it."""

from __future__ import annotations

import pytest
import torch
import wsync
from wsync.checkpoint import checkpoint_tensors
from wsync.models import tensors_from_config

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=128, max_position_embeddings=64)
FAMILIES = {
    "llama": {},
    "llama_bias": {"attention_bias": True},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"head_dim": 32},
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": [1]},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def _config(family: str, tied: bool):
    from transformers import AutoConfig

    model_type = family.split("_bias")[0]
    kw = dict(COMMON, **FAMILIES[family], tie_word_embeddings=tied)
    return AutoConfig.for_model(model_type, **kw)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tensor_list_matches_transformers(family, tied):
    from transformers import AutoModelForCausalLM

    cfg = _config(family, tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    sd = dict(checkpoint_tensors(model.state_dict()))
    if tied:
        sd.pop("lm_head.weight", None)  # a tied checkpoint stores the embedding once
    got = tensors_from_config(cfg.to_dict() | {"torch_dtype": "bfloat16"})
    assert [n for n, _, _ in got] == list(dict.fromkeys(n for n, _, _ in got))  # no name twice
    assert {n for n, _, _ in got} == set(sd), (sorted(set(sd) - {n for n, _, _ in got})[:4],
                                               sorted({n for n, _, _ in got} - set(sd))[:4])
    for n, dtype, shape in got:
        assert dtype == sd[n].dtype and shape == tuple(sd[n].shape), (n, dtype, shape, sd[n].dtype, sd[n].shape)


def test_unknown_model_type_is_named():
    with pytest.raises(wsync.errors.InvalidArgument) as e:
        tensors_from_config({"model_type": "gpt_neox", "hidden_size": 8})
    assert "gpt_neox" in str(e.value)
    with pytest.raises(wsync.errors.InvalidArgument) as e:
        tensors_from_config({"model_type": "qwen3", "hidden_size": 8})
    assert "num_hidden_layers" in str(e.value)


def test_config_json_path(tmp_path):
    cfg = _config("qwen3", False)
    cfg.save_pretrained(tmp_path)
    got = tensors_from_config(tmp_path)
    assert got[0][0] == "model.embed_tokens.weight" and got[-1][0] == "lm_head.weight"
