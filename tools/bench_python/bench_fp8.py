"""FP8 benchmark (a program, not a test): bf16 trainer tensors quantized inside wsync's copy into an
engine's FP8 block-scaled parameters (e4m3fn weight + float32 weight_scale_inv per 128 x 128
block, SGLang's fused layout), on one GPU, two processes. Prints ratios against baselines run in
the same engine process:

  the bandwidth limit for the bytes the quantizing copy reads and writes: one cudaMemcpyAsync
  moving that many bytes (it reads N and writes N: N = (read + written) / 2);
  the way frameworks quantize on sync today: a torch loop that runs DeepGEMM's
  per_block_cast_to_fp8 per tensor and copies the result (and the scales) into the parameters.

Rows: wsync with the NaN check before any write (a read of the sources, then the quantizing
pass) and with fp8_one_pass (the check inside the one pass); each as event time of one request
(apply + drain) and as the copies' GPU time alone (queued behind a sleep). Every wsync result is
compared byte for byte with the torch loop's. Layouts: the Qwen3-8B-shaped dense model (399
tensors) and a Qwen3-30B-A3B-shaped MoE (12 layers, 128 experts, 4 719 tensors); for the MoE also
expert parallelism 8: each EP rank's bytes and time against the EP 1 sync.

  usage: python tools/bench_python/bench_fp8.py [--iters N] [--layout dense|moe|both]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics

import torch
from bench_python import CFG, attention_shapes, event_ms, flat_views, hf_shapes, plugin

MOE = {"L": 12, "H": 2048, "NH": 32, "KV": 4, "HD": 128, "I": 768, "E": 128, "V": 151936}
MOE_CFG = {"hidden_size": MOE["H"], "num_attention_heads": MOE["NH"], "num_key_value_heads": MOE["KV"],
           "head_dim": MOE["HD"], "intermediate_size": 6144, "moe_intermediate_size": MOE["I"],
           "num_experts": MOE["E"], "vocab_size": MOE["V"]}
FP8_SUFFIX = ("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight", "w13_weight", "w2_weight")


def moe_hf_shapes():
    L, H, NH, KV, HD, inter, E, V = (MOE[k] for k in ("L", "H", "NH", "KV", "HD", "I", "E", "V"))
    s = {"model.embed_tokens.weight": (V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        s |= attention_shapes(p, H, NH, KV, HD) | {p + "mlp.gate.weight": (E, H)}
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            s |= {q + "gate_proj.weight": (inter, H), q + "up_proj.weight": (inter, H), q + "down_proj.weight": (H, inter)}
    s |= {"model.norm.weight": (H,), "lm_head.weight": (V, H)}
    return s


def placement(layout: str):
    """HF name -> (engine parameter, index or None, row offset) in SGLang's fused layout, and the
    engine parameters' bf16 shapes (for the torch loop: where each tensor lands)."""
    hf = hf_shapes() if layout == "dense" else moe_hf_shapes()
    q, k, g = "self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.gate_proj.weight"
    fused = ((q, "self_attn.qkv_proj.weight", ()), (k, "self_attn.qkv_proj.weight", (q,)),
             ("self_attn.v_proj.weight", "self_attn.qkv_proj.weight", (q, k)),
             (g, "mlp.gate_up_proj.weight", ()), ("mlp.up_proj.weight", "mlp.gate_up_proj.weight", (g,)))
    where, shapes = {}, {}
    for n, s in hf.items():
        hit = [(a, b, o) for a, b, o in fused if n.endswith("." + a)]
        if hit:
            a, b, others = hit[0]
            e = n[: -len(a)] + b
            off = sum(hf[n[: -len(a)] + x][0] for x in others)  # the rows of the parts before it
            where[n] = (e, None, off)
            shapes[e] = (shapes.get(e, (0, s[1]))[0] + s[0], s[1])
        elif ".experts." in n:
            base, rest = n.split(".experts.")
            e_idx, kind = int(rest.split(".")[0]), rest.split(".")[1]
            name = base + (".experts.w2_weight" if kind == "down_proj" else ".experts.w13_weight")
            where[n] = (name, e_idx, MOE["I"] if kind == "up_proj" else 0)
            shapes[name] = (MOE["E"], 2 * MOE["I"] if kind != "down_proj" else MOE["H"], s[1])
        else:
            where[n] = (n, None, 0)
            shapes[n] = s
    return hf, where, shapes


def fp8_params(shapes, experts=None):
    """The engine's parameters: FP8 linear weights with block scales, the rest bf16; experts a
    range of global expert indices (expert parallelism: only those are held, by local index)."""
    out = {}
    for n, s in shapes.items():
        if n.endswith(FP8_SUFFIX):
            if len(s) == 3:
                e = len(experts) if experts is not None else s[0]
                out[n] = torch.zeros((e, s[1], s[2]), dtype=torch.float8_e4m3fn, device="cuda")
                out[n.replace("_weight", "_weight_scale_inv")] = torch.zeros(
                    (e, math.ceil(s[1] / 128), math.ceil(s[2] / 128)), dtype=torch.float32, device="cuda")
            else:
                out[n] = torch.zeros(s, dtype=torch.float8_e4m3fn, device="cuda")
                out[n[: -len("weight")] + "weight_scale_inv"] = torch.zeros(
                    (math.ceil(s[0] / 128), math.ceil(s[1] / 128)), dtype=torch.float32, device="cuda")
        else:
            out[n] = torch.zeros(s, dtype=torch.bfloat16, device="cuda")
    return out


def per_block_cast_to_fp8(x: torch.Tensor):
    """DeepGEMM's per_block_cast_to_fp8 in torch: what a framework runs per tensor on sync."""
    m, n = x.shape
    xp = x
    if m % 128 or n % 128:
        xp = torch.zeros((math.ceil(m / 128) * 128, math.ceil(n / 128) * 128), dtype=x.dtype, device=x.device)
        xp[:m, :n] = x
    xv = xp.view(-1, 128, xp.size(1) // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
    return q.view_as(xp)[:m, :n], (amax / 448.0).view(xv.size(0), xv.size(2))


def torch_loop(pairs, params):
    """pairs: (HF view, (engine name, expert index, row offset)); into params (fp8 + scales)."""
    def run():
        for x, (name, e, off) in pairs:
            dst = params[name] if e is None else params[name][e]
            if dst.dtype != torch.float8_e4m3fn:
                dst.copy_(x)
                continue
            sname = name.replace("_weight", "_weight_scale_inv") if e is not None else name[:-6] + "weight_scale_inv"
            sc = params[sname] if e is None else params[sname][e]
            q, s = per_block_cast_to_fp8(x)
            dst[off: off + x.shape[0]].copy_(q)
            sc[off // 128: off // 128 + s.shape[0]].copy_(s)
    return run


def trainer(conn, layout, n_msgs):
    from wsync.export import TorchExport

    hf = hf_shapes() if layout == "dense" else moe_hf_shapes()
    total = sum(torch.Size(s).numel() for s in hf.values())
    flat = torch.randn(total, dtype=torch.bfloat16, device="cuda")
    views = flat_views(flat, hf)
    exp = TorchExport("sglang")
    msgs = [exp.messages(views)[0] for _ in range(n_msgs)]
    from torch.multiprocessing.reductions import reduce_tensor
    conn.send((msgs, reduce_tensor(flat)))
    conn.recv()


def differences(params, ref):
    """'equal to the torch loop's', or which parameters differ (fp8 bytes, scales: how many
    elements, the largest difference in units of the last place)."""
    bad = [n for n in ref if not torch.equal(params[n].view(torch.uint8), ref[n].view(torch.uint8))]
    if not bad:
        return "bytes equal to the torch loop's"
    out = []
    for n in bad[:3]:
        a, b = params[n], ref[n]
        if a.dtype == torch.float32:
            d = (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()
        else:
            d = (a.view(torch.uint8).long() - b.view(torch.uint8).long()).abs()
        out.append(f"{n}: {int((d > 0).sum())} of {d.numel()} elements, up to {int(d.max())} ulp")
    return f"DIFFERENT from the torch loop's in {len(bad)} parameters: " + "; ".join(out)


def run_layout(layout, iters):
    import wsync

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    per_mode = 2 * iters + 2
    p = ctx.Process(target=trainer, args=(b, layout, per_mode * 3 + 4 * 8), daemon=True)
    p.start()
    msgs, red = a.recv()
    it = iter(msgs)
    src = red[0](*red[1])
    hf, where, shapes = placement(layout)
    cfg = CFG if layout == "dense" else MOE_CFG
    pairs = [(v, where[n]) for n, v in flat_views(src, hf)]
    ref = fp8_params(shapes)
    loop = torch_loop(pairs, ref)
    loop_ms = event_ms(loop, iters)
    read = src.numel() * 2
    written = sum(t.numel() * t.element_size() for t in ref.values())
    n_copy = (read + written) // 2
    bufs = [torch.empty(n_copy, dtype=torch.uint8, device="cuda") for _ in range(2)]
    limit_ms = event_ms(lambda: bufs[1].copy_(bufs[0]), iters)
    bufs.clear()
    gb = (read + written) / 1e9
    print(f"{layout}: {len(hf)} bf16 tensors ({read / 1e9:.2f} GB) into {len(ref)} engine parameters, "
          f"{sum(t.dtype == torch.float8_e4m3fn for t in ref.values())} of them fp8 ({written / 1e9:.2f} GB written); "
          f"median of {iters}")
    print(f"  limit: one cudaMemcpyAsync of {n_copy / 1e9:.2f} GB (reads + writes {gb:.2f} GB) {limit_ms:8.2f} ms")
    print(f"  torch per-tensor per_block_cast_to_fp8 + copy_ loop          {loop_ms:8.2f} ms  "
          f"({limit_ms / loop_ms:.3f} of the limit)")

    def measure(w):
        def apply_drain():
            w.apply(next(it))
            w.drain()
        ms = event_ms(apply_drain, iters)
        g = []
        for _ in range(iters):
            torch.cuda._sleep(200_000_000)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            w.apply(next(it))
            e1.record()
            w.drain()
            g.append(e0.elapsed_time(e1))
        return ms, statistics.median(g)

    results = {}
    for one_pass in (False, True):
        params = fp8_params(shapes)
        w = wsync.EngineWorker(params, engine="sglang", config=cfg, plugin=plugin(), fp8_one_pass=one_pass)
        ms, g = measure(w)
        same = differences(params, ref)
        what = "fp8_one_pass (check inside the one pass)" if one_pass else "NaN check before any write"
        print(f"  wsync, {what:40s}\n    {ms:8.2f} ms  ({limit_ms / ms:.3f} of the limit; "
              f"{loop_ms / ms:.2f}x faster than the torch loop); GPU alone {g:.2f} ms ({limit_ms / g:.3f}); {same}")
        results.setdefault(one_pass, ms)
        w.release()
        w.close()
        del params
    if layout == "moe":
        ep = 8
        per = MOE["E"] // ep
        for r in range(ep):
            params = fp8_params(shapes, experts=range(r * per, (r + 1) * per))
            w = wsync.EngineWorker(params, engine="sglang", config=cfg, plugin=plugin(), fp8_one_pass=True,
                                   ep_rank=r, ep_size=ep)
            ms = event_ms(lambda w=w: (w.apply(next(it)), w.drain()), 2)
            moved = sum(t.numel() * t.element_size() for t in params.values())
            mine = {n: ref[n][r * per: (r + 1) * per] if ".experts." in n else ref[n] for n in params}
            same = differences(params, mine)
            if r in (0, ep - 1):
                print(f"  EP {ep} rank {r}: {moved / 1e9:.2f} GB written ({moved / written:.3f} of EP 1), "
                      f"{ms:.2f} ms ({ms / results[True]:.3f} of the EP 1 sync); {same}")
            w.release()
            w.close()
            del params
    a.send("done")
    p.join(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--layout", default="both", choices=("dense", "moe", "both"))
    args = ap.parse_args()
    for layout in ("dense", "moe"):
        if args.layout in (layout, "both"):
            run_layout(layout, args.iters)


if __name__ == "__main__":
    main()
