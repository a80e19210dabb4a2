"""`wsync plan` on a 1T-parameter MoE (a Kimi-K2-sized Qwen3-MoE: 61 layers, 384 experts of
2048, hidden 7168, 2.08 TB in bf16) from a trainer of TP 8 x FSDP 8 x PP 4 (256 GPUs, 32 nodes
of 8) into SGLang TP 8 replicas on the same GPUs, checked by arithmetic written here without
the planner: per stage the bytes of the TP-split, replicated and expert tensors, who holds
which piece, and so what each engine rank reads over each link and what each trainer rank
sends; the lower bound on time from the links' bandwidths. Twice: EP 8 inside each replica's TP
group, and EP 256 across the replicas (each GPU its own experts).

usage: python3 plan_check.py PATH/TO/wsync   (exit 0 when every number agrees)
"""

import json
import os
import subprocess
import sys
import tempfile

L, H, NH, KV, HD, MI, E, V = 61, 7168, 64, 8, 128, 2048, 384, 163840
TP, FSDP, PP, GPN = 8, 8, 4, 8
WORLD = TP * FSDP * PP
ETP = 8
NVLINK, NET, HBM = 450e9, 50e9, 4000e9


def stage_of_layer(layer):
    for s in range(PP - 1):
        if layer < (s + 1) * L // PP:
            return s
    return PP - 1


def stage_bytes():
    """Per trainer stage: bytes of TP-split tensors, of replicated ones, of experts (bf16)."""
    tp = [0] * PP
    rep = [0] * PP
    exp = [0] * PP
    for layer in range(L):
        s = stage_of_layer(layer)
        tp[s] += 2 * (NH * HD * H + 2 * KV * HD * H + H * NH * HD)  # q, k, v, o
        rep[s] += 2 * (2 * HD + 2 * H + E * H)  # q/k norms, the two layer norms, the router
        exp[s] += 2 * E * 3 * MI * H
    tp[0] += 2 * V * H  # embeddings: the first stage
    tp[PP - 1] += 2 * V * H  # lm_head and the final norm: the last
    rep[PP - 1] += 2 * H
    return tp, rep, exp


def expected_ep_across(eep):
    """EP over every GPU: the attention as with EP inside TP; each expert read once, by its owner
    (the linear placement), from the 64 pieces of it the trainer holds in its stage."""
    tp, rep, exp = stage_bytes()
    base = sum(tp) // ETP + sum(rep)
    per, extra = E // eep, E % eep
    owner = [x // (per + 1) if x < extra * (per + 1) else extra + (x - extra * (per + 1)) // per for x in range(E)]
    piece = 2 * 3 * MI * H // (TP * FSDP)  # one trainer rank's piece of one expert's three tensors
    need = [base] * WORLD
    local = [0] * WORLD
    nv = [0] * WORLD
    for g in range(WORLD):
        j = g // ETP
        s = j // FSDP
        local[g] = tp[s] // (ETP * FSDP) + rep[s] // FSDP
    for layer in range(L):
        s = stage_of_layer(layer)
        for x in range(E):
            g = owner[x]
            need[g] += piece * TP * FSDP
            if g // (ETP * FSDP) == s:  # the owner's GPU holds a trainer rank of that stage
                local[g] += piece
                nv[g] += piece * (TP - 1)
    net = [a - b - c for a, b, c in zip(need, local, nv)]
    return {"needed": sum(need), "local": sum(local), "nvlink": sum(nv), "network": sum(net),
            "max_in": [max(local), max(nv), max(net)]}


def expected(eep=8):
    tp, rep, exp = stage_bytes()
    # every engine rank writes its TP shard of the split tensors, the whole replicated ones and
    # all of its 48 experts (EP 8 inside TP 8: expert TP 1)
    need = sum(tp) // ETP + sum(rep) + sum(exp) // eep
    local_r, nv_r = [], []
    for s in range(PP):
        # engine rank (replica j, rank i) sits on trainer rank (tp i, fsdp j % 8, stage j // 8):
        # of the stage's tensors it holds fsdp chunk j % 8 of shard i, and of its own experts
        # 1/64 (shard i, chunk j % 8); the other 7 shards of that chunk are on its node
        local_r.append(tp[s] // (ETP * FSDP) + rep[s] // FSDP + exp[s] // eep // (TP * FSDP))
        nv_r.append(exp[s] // eep * (TP - 1) // (TP * FSDP))
    per_stage = WORLD // PP  # engine ranks sitting on each trainer stage
    local = sum(per_stage * x for x in local_r)
    nvlink = sum(per_stage * x for x in nv_r)
    network = WORLD * need - local - nvlink
    max_in = [max(local_r), max(nv_r), max(need - a - b for a, b in zip(local_r, nv_r))]
    # trainer rank (k, f, s): 32 engine replicas read each of its pieces; one sits on its GPU
    # (and, for experts another rank owns, 7 of 8 on its node), the other 31 on other nodes;
    # its replicated chunk is read by the 31 remote ranks numbered k of their replica
    out_net = [31 * (tp[s] // (TP * FSDP) + rep[s] // FSDP + exp[s] // (TP * FSDP)) for s in range(PP)]
    out_nv = [exp[s] // (TP * FSDP) * (eep - 1) // eep for s in range(PP)]
    max_out = [0, max(out_nv), max(out_net)]
    bound = max(max_in[0] / (HBM / 2), max_in[1] / NVLINK, max_in[2] / NET, max_out[1] / NVLINK, max_out[2] / NET)
    return {"needed": WORLD * need, "local": local, "nvlink": nvlink, "network": network,
            "max_in": max_in, "max_out": max_out, "bound_s": bound,
            "model_bytes": sum(tp) + sum(rep) + sum(exp)}


def run(exe, path, eep):
    args = [exe, "plan", path, "--trainer", f"tp={TP},fsdp={FSDP},pp={PP}", "--engine", "sglang",
            "--engine-tp", str(ETP), "--engine-ep", str(eep), "--gpus-per-node", str(GPN), "--json"]
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    print(text, end="")
    return json.loads(text.strip().splitlines()[-1])


def bound_of(got):
    """The bound from a plan's own maxima: what the tool must have computed from them."""
    return max(got["max_in"][0] / (HBM / 2), got["max_in"][1] / NVLINK, got["max_in"][2] / NET,
               got["max_out"][1] / NVLINK, got["max_out"][2] / NET)


def main():
    exe = sys.argv[1]
    cfg = {"model_type": "qwen3_moe", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": NH,
           "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": 18432, "moe_intermediate_size": MI,
           "num_experts": E, "num_experts_per_tok": 8, "vocab_size": V, "tie_word_embeddings": False,
           "decoder_sparse_step": 1, "mlp_only_layers": []}
    bad = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        got = run(exe, path, 8)
        across = run(exe, path, WORLD)
    want = expected()
    for k in ("model_bytes", "needed", "local", "nvlink", "network", "max_in"):
        if got[k] != want[k]:
            bad.append(f"{k}: wsync plan {got[k]}, arithmetic {want[k]}")
    if got["max_out"][1:] != want["max_out"][1:]:
        bad.append(f"max_out: wsync plan {got['max_out']}, arithmetic {want['max_out']}")
    if abs(got["bound_s"] - want["bound_s"]) > 1e-8 * want["bound_s"]:
        bad.append(f"bound_s: wsync plan {got['bound_s']}, arithmetic {want['bound_s']}")
    if got["model_bytes"] < 2e12:
        bad.append(f"the model holds {got['model_bytes']} bytes: not a 1T-parameter model")
    want2 = expected_ep_across(WORLD)
    for k in ("needed", "local", "nvlink", "network", "max_in"):
        if across[k] != want2[k]:
            bad.append(f"EP {WORLD} across replicas, {k}: wsync plan {across[k]}, arithmetic {want2[k]}")
    if abs(across["bound_s"] - bound_of(across)) > 1e-8 * across["bound_s"]:
        bad.append(f"EP {WORLD}: bound_s {across['bound_s']} is not what its maxima give ({bound_of(across)})")
    for b in bad:
        print("plan_check: FAIL:", b)
    if not bad:
        print(f"plan_check: the plans' bytes per link, per rank and their time bounds "
              f"({want['bound_s'] * 1e3:.1f} ms with EP 8 in each replica, "
              f"{across['bound_s'] * 1e3:.1f} ms with EP {WORLD} across them) agree with the arithmetic")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
