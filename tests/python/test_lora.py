"""A LoRA adapter saved by peft itself (f32, every linear module of a transformers Qwen3) hot-loaded
through the Python engine side into SGLang-layout slots (packed qkv_proj and gate_up_proj):
every slot byte equals the reference stacked with torch from peft's tensors (parts along the
rank, zero padding, bf16), with rank and scaling; a same-name reload switches copies; an adapter
whose rank the slots cannot hold is refused naming the module, and the active copy stays as it
was."""

from __future__ import annotations

import models
import pytest
import torch
import wsync
from conftest import plugin_for
from safetensors.torch import load_file
from wsync import errors
from wsync.lora import LoraSlots, LoraTarget

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def targets(cfg):
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = []
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        out += [
            LoraTarget(p + "self_attn.qkv_proj", h, q + 2 * kv, [("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)]),
            LoraTarget(p + "self_attn.o_proj", q, h),
            LoraTarget(p + "mlp.gate_up_proj", h, 2 * i, [("gate_proj", 0, i), ("up_proj", i, i)]),
            LoraTarget(p + "mlp.down_proj", i, h),
        ]
    return out


def save_adapter(tmp_path, seed, r=8, alpha=16):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = models.tiny_model("dense").float()
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=MODULES, init_lora_weights=False))
    d = tmp_path / f"adapter-{seed}-{r}"
    peft_model.save_pretrained(str(d))
    return d, load_file(str(d / "adapter_model.safetensors")), model.config


def expected(t: LoraTarget, sd, max_rank):
    a = torch.zeros((max_rank, t.in_features))
    b = torch.zeros((t.out_features, max_rank))
    parts = t.parts or [(t.module.rsplit(".", 1)[1], 0, t.out_features)]
    base = t.module.rsplit(".", 1)[0]
    c = 0
    for suffix, off, n in parts:
        key = f"base_model.model.{base}.{suffix}"
        pa, pb = sd[key + ".lora_A.weight"], sd[key + ".lora_B.weight"]
        r = pa.shape[0]
        a[c : c + r] = pa
        b[off : off + n, c : c + r] = pb
        c += r
    return a.to(torch.bfloat16), b.to(torch.bfloat16), c


def load(w, name, path):
    return w.apply(f'{{"method":"load_lora_adapter","lora_name":"{name}","lora_path":"{path}"}}')


def check(slots, name, sd, scaling):
    got = slots.active(name)
    assert got is not None
    for t in slots.targets:
        a, b, s, rank = got[t.module]
        ea, eb, er = expected(t, sd, slots.max_rank)
        assert rank == er and s == pytest.approx(scaling), t.module
        assert torch.equal(a, ea) and torch.equal(b, eb), t.module


def test_peft_adapter_hot_load(tmp_path):
    d1, sd1, cfg = save_adapter(tmp_path, 1)
    d2, sd2, _ = save_adapter(tmp_path, 2)
    slots = LoraSlots(targets(cfg), max_rank=32)
    params = models.zeros_like_layout(models.engine_layout(dict(models.tiny_model("dense").state_dict()), "sglang", 0, 1))
    with wsync.EngineWorker(params, engine="sglang", config=cfg, plugin=plugin_for("cpu"), lora=slots) as w:
        load(w, "math", d1)
        check(slots, "math", sd1, 16 / 8)
        load(w, "math", d2)  # same name: upsert into the shadow copy, then switch
        check(slots, "math", sd2, 16 / 8)
        before = {t.module: tuple(x.clone() for x in slots.active("math")[t.module][:2]) for t in slots.targets}
        d3, _, _ = save_adapter(tmp_path, 3, r=64)  # rank 64 > the slots' 32
        with pytest.raises(errors.LayoutMismatch) as e:
            load(w, "math", d3)
        assert "model.layers.0.self_attn.qkv_proj" in str(e.value) and "max_rank 32" in str(e.value)
        after = slots.active("math")
        for m, (a, b) in before.items():
            assert torch.equal(after[m][0], a) and torch.equal(after[m][1], b), m
        w.apply('{"method":"unload_lora_adapter","lora_name":"math"}')
        assert slots.active("math") is None


@pytest.mark.parametrize("damage, exc", [("truncated_safetensors", errors.OutOfBounds),
                                         ("config_not_json", errors.BadAdapter)])
def test_damaged_adapter_files(tmp_path, damage, exc):
    """A PEFT directory whose files are damaged is refused with the adapter's own codes (offsets
    past the file: OutOfBounds; malformed content: BadAdapter) naming the file, never as a bad
    manifest, and the adapter already loaded stays active byte for byte."""
    d1, sd1, cfg = save_adapter(tmp_path, 1)
    d2, _, _ = save_adapter(tmp_path, 2)
    if damage == "truncated_safetensors":
        f = d2 / "adapter_model.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    else:
        f = d2 / "adapter_config.json"
        f.write_text(f.read_text()[:-20])
    slots = LoraSlots(targets(cfg), max_rank=32)
    params = models.zeros_like_layout(models.engine_layout(dict(models.tiny_model("dense").state_dict()), "sglang", 0, 1))
    with wsync.EngineWorker(params, engine="sglang", config=cfg, plugin=plugin_for("cpu"), lora=slots) as w:
        load(w, "math", d1)
        with pytest.raises(exc) as e:
            load(w, "math", d2)
        assert f.name in str(e.value), str(e.value)
        assert not isinstance(e.value, errors.BadManifest)
        check(slots, "math", sd1, 16 / 8)
