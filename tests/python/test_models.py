"""The model layer (model/wsync_model.h): the HF tensor list derived from a config equals, name
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


def _config(family: str, tied: bool, **extra):
    from transformers import AutoConfig

    model_type = family.split("_bias")[0]
    kw = dict(COMMON, **FAMILIES[family], tie_word_embeddings=tied) | extra
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


def _save(tmp_path, family: str, tied: bool = False, dtype=torch.bfloat16, shard: str | None = None, **extra):
    from transformers import AutoModelForCausalLM

    cfg = _config(family, tied, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path, safe_serialization=True, **kw)
    return model


@pytest.mark.parametrize("family,tied,shard", [("qwen3", False, None), ("qwen3_moe", False, None),
                                               ("llama", True, None), ("qwen3", False, "40KB")],
                         ids=["dense", "moe", "tied", "two-shards"])
def test_inspect_checkpoints_written_by_transformers(tmp_path, family, tied, shard):
    import os

    from wsync.models import inspect

    _save(tmp_path, family, tied, shard=shard)
    plan = inspect(tmp_path)
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert plan["shards"] == len(shards) and (len(shards) > 1) == (shard is not None), shards
    names = [p["name"] for p in plan["plan"]]
    want = [n for n, _, _ in tensors_from_config(tmp_path)]
    assert names == want and plan["tensors"] == len(want)
    assert all(p["engine_param"] for p in plan["plan"]), [p for p in plan["plan"] if not p["engine_param"]][:2]
    by = {p["name"]: p for p in plan["plan"]}
    if family == "qwen3":
        assert by["model.layers.0.self_attn.k_proj.weight"]["engine_param"].endswith("qkv_proj.weight")
    if family == "qwen3_moe":
        e = by["model.layers.0.mlp.experts.3.up_proj.weight"]
        assert e["engine_param"].endswith("w13_weight") and e["expert"] == 3
    assert ("lm_head.weight" in by) == (not tied)


def test_inspect_f32_checkpoint_and_refusals(tmp_path):
    import json
    import os

    from safetensors.torch import load_file, save_file
    from wsync.models import inspect

    _save(tmp_path, "qwen3", dtype=torch.float32)
    plan = inspect(tmp_path)
    assert {p["file_dtype"] for p in plan["plan"]} == {"float32"}
    path = os.path.join(tmp_path, "model.safetensors")
    sd = load_file(path)
    # a tensor the config needs, missing: named, nothing else read
    name = "model.layers.1.mlp.down_proj.weight"
    save_file({k: v for k, v in sd.items() if k != name}, path, metadata={"format": "pt"})
    with pytest.raises(wsync.WsyncError) as e:
        inspect(tmp_path)
    assert name in str(e.value) and "missing" in str(e.value)
    # a shape that disagrees with config.json
    sd[name] = sd[name][:, :-1].contiguous()
    save_file(sd, path, metadata={"format": "pt"})
    with pytest.raises(wsync.WsyncError) as e:
        inspect(tmp_path)
    assert name in str(e.value) and "config.json says" in str(e.value)
    # an integer tensor where the model holds floats never converts
    sd[name] = torch.zeros(tensors_shape(tmp_path, name), dtype=torch.int32)
    save_file(sd, path, metadata={"format": "pt"})
    with pytest.raises(wsync.WsyncError) as e:
        inspect(tmp_path)
    assert name in str(e.value) and "never integers" in str(e.value)
    # an unknown model_type
    cfg = json.load(open(os.path.join(tmp_path, "config.json")))
    cfg["model_type"] = "falcon"
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    with pytest.raises(wsync.WsyncError) as e:
        inspect(tmp_path)
    assert "falcon" in str(e.value)


def tensors_shape(model_dir, name):
    return next(s for n, _, s in tensors_from_config(model_dir) if n == name)


def test_cli_inspect(tmp_path):
    import os
    import subprocess

    _save(tmp_path, "qwen3_moe")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.environ.get("WSYNC_BUILD", os.path.join(root, "build"))
    exe = next((e for e in (os.path.join(str(wsync._native.lib_dir()), "..", "bin", "wsync"),
                            os.path.join(build, "bin", "wsync")) if os.path.exists(e)), "wsync")
    if not os.path.exists(exe):
        pytest.skip(f"no wsync CLI at {exe} (the package alone is installed)")
    out = subprocess.run([exe, "inspect", str(tmp_path), "--engine", "vllm"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "w13_weight [expert 3]" in out.stdout and out.stdout.strip().splitlines()[-1].startswith("qwen3_moe:")


def _cli():
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.environ.get("WSYNC_BUILD", os.path.join(root, "build"))
    for e in (os.path.join(str(wsync._native.lib_dir()), "..", "bin", "wsync"), os.path.join(build, "bin", "wsync")):
        if os.path.exists(e):
            return e
    pytest.skip("no wsync CLI beside the package or in the build tree (the package alone is installed)")


@pytest.mark.parametrize("family,tied,engine,f32,tp",
                         [("qwen3", False, None, False, 1), ("qwen3_moe", False, "vllm", False, 2),
                          ("qwen3", True, "sglang", False, 2), ("qwen3", False, "lmdeploy", False, 2),
                          ("qwen3", False, None, True, 1), ("qwen3", False, "sglang", True, 2),
                          ("qwen3", False, "sglang", True, 1), ("qwen3_moe", False, "vllm", True, 1),
                          ("qwen3", True, "lmdeploy", True, 1), ("qwen3", False, "vllm", True, 2),
                          ("qwen3_moe", False, "lmdeploy", True, 2)],
                         ids=["dense-cpu-demo", "moe-vllm-tp2", "tied-sglang-tp2", "dense-lmdeploy-tp2",
                              "f32-into-bf16-cpu-demo", "f32-into-bf16-sglang-tp2", "f32-into-bf16-sglang-tp1",
                              "f32-moe-into-bf16-vllm-tp1", "f32-tied-into-bf16-lmdeploy-tp1",
                              "f32-into-bf16-vllm-tp2", "f32-moe-into-bf16-lmdeploy-tp2"])
def test_demo_pushes_a_checkpoint(tmp_path, family, tied, engine, f32, tp):
    """wsync demo --model DIR: the checkpoint transformers wrote goes through the plugin (and the
    engine's shim, at TP 1 and 2) into the reference engine, which allocates its parameters from the
    same config.json and checks every one against the file's bytes."""
    import os
    import subprocess

    exe = _cli()
    # the reference engine holds every layer of a MoE model sparse
    _save(tmp_path / "m", family, tied, dtype=torch.float32 if f32 else torch.bfloat16,
          **({"mlp_only_layers": []} if family == "qwen3_moe" else {}))
    args = [exe, "demo", "--model", str(tmp_path / "m"), "--syncs", "3"]
    if f32:  # an f32 checkpoint into a model that holds bf16: converted on the way
        args += ["--dtype", "bfloat16"]
    if engine:
        args += ["--engine", engine, "--tp", str(tp)]
    env = dict(os.environ, WSYNC_PLUGIN_DIR=str(wsync._native.lib_dir()))
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    n = len(tensors_from_config(tmp_path / "m"))
    if engine:
        assert "all ranks verified" in out.stdout and "verified" in out.stdout
    else:
        assert f"verified {n}/{n} tensors" in out.stdout, out.stdout
