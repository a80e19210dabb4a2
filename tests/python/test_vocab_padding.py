"""Vocabulary padding: vLLM and SGLang hold embed_tokens / lm_head padded to a multiple of 64
rows before the TP split (VocabParallelEmbedding, pad_vocab_size), so a vocab of 1000 at TP 2
is 512 rows per rank. Each rank's real rows take the HF rows below vocab_size; the padding rows
stay as the engine initialised them. The oracle pads with torch, independently of the C
mapping."""

from __future__ import annotations

import pytest
import torch
import wsync
from conftest import plugin_for

VOCAB, HIDDEN, PAD = 1000, 64, 64
SENTINEL = 7.0  # what the engine initialised its padding rows with


def _config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=False)


def _padded_rows(t: torch.Tensor, r: int, tp: int) -> torch.Tensor:
    """The oracle: rank r's block of `t` padded to a multiple of PAD rows, padding = SENTINEL."""
    padded = -(-t.shape[0] // PAD) * PAD
    full = torch.full((padded, t.shape[1]), SENTINEL, dtype=t.dtype)
    full[: t.shape[0]] = t
    return full.chunk(tp)[r].clone()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("tp", [1, 2])
def test_padded_vocab_syncs_bit_exact(engine, tp):
    g = torch.Generator().manual_seed(3)
    sd = {n: torch.randn(VOCAB, HIDDEN, generator=g).to(torch.bfloat16)
          for n in ("model.embed_tokens.weight", "lm_head.weight")}
    ranks = []
    for r in range(tp):
        params = {n: torch.full(_padded_rows(t, r, tp).shape, SENTINEL, dtype=t.dtype) for n, t in sd.items()}
        ranks.append((params, wsync.EngineWorker(params, engine=engine, config=_config(), tp_rank=r, tp_size=tp,
                                                 plugin=plugin_for("cpu"))))
    with wsync.Producer(engine, tp_size=tp, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        for step in range(2):
            sd = {n: t + step for n, t in sd.items()}
            prod.sync(sd, lambda m: [w.handle(m) for _, w in ranks], version=step + 1)
            for r, (params, _) in enumerate(ranks):
                for n, t in sd.items():
                    assert torch.equal(params[n], _padded_rows(t, r, tp)), (n, r)
        for _, w in ranks:
            w.release()
    for _, w in ranks:
        w.close()


def test_vocab_larger_than_the_padded_rows_is_refused_naming_both():
    """An engine whose rows cannot hold the vocabulary: the message names the parameter, its
    rows and vocab_size, and nothing is written."""
    params = {"model.embed_tokens.weight": torch.zeros(448, HIDDEN, dtype=torch.bfloat16)}
    before = params["model.embed_tokens.weight"].clone()
    w = wsync.EngineWorker(params, engine="vllm", config=_config(), tp_rank=0, tp_size=2, plugin=plugin_for("cpu"))
    sd = {"model.embed_tokens.weight": torch.ones(VOCAB, HIDDEN, dtype=torch.bfloat16)}
    with wsync.Producer("vllm", tp_size=2, bucket_bytes=1 << 20, plugin=plugin_for("cpu")) as prod:
        with pytest.raises(wsync.WsyncError) as e:
            prod.sync(sd, lambda m: [w.handle(m)])
        assert "448 vocabulary rows per rank" in str(e.value) and "vocab_size 1000" in str(e.value), str(e.value)
        assert torch.equal(params["model.embed_tokens.weight"], before)
        w.release()
    w.close()
