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

Scale layouts (--scales, default all three): 128 x 128 blocks (weight_scale_inv), and vLLM's
per-channel [R, 1] and per-tensor [1] weight_scale, each against its own torch loop.

With --profile, each fp8_one_pass row is followed by the GPU timelines of three more requests
(each queued behind a sleep), from torch's profiler: the median span from the first operation's
start to the last one's end, as a ratio to the limit, and the first request's kernels and copies,
each with its start and its time.

  usage: python bench/python/bench_fp8.py [--iters N] [--layout dense|moe|both]
                                                [--scales block,channel,tensor] [--profile]
"""

from __future__ import annotations

import argparse
import gc
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


def scale_name(name: str, scheme: str) -> str:
    """The scale parameter beside fp8 parameter `name`: weight_scale_inv (block), weight_scale."""
    return name + ("_scale_inv" if scheme == "block" else "_scale")


def scale_shape(s, scheme: str):
    """Block: [ceil(R / 128), ceil(C / 128)]; channel: [R, 1]; tensor: [1] ([E, ...] for experts)."""
    e, (r, c) = (s[:-2], s[-2:])
    return e + ((math.ceil(r / 128), math.ceil(c / 128)) if scheme == "block" else (r, 1) if scheme == "channel"
                else ((1,) if not e else ()))


def fp8_params(shapes, experts=None, scheme="block"):
    """The engine's parameters: FP8 linear weights with their scales (scheme: block, channel or
    tensor), the rest bf16; experts a range of global expert indices (expert parallelism: only
    those are held, by local index)."""
    out = {}
    for n, s in shapes.items():
        if n.endswith(FP8_SUFFIX):
            if len(s) == 3 and experts is not None:
                s = (len(experts), s[1], s[2])
            out[n] = torch.zeros(s, dtype=torch.float8_e4m3fn, device="cuda")
            out[scale_name(n, scheme)] = torch.zeros(scale_shape(s, scheme), dtype=torch.float32, device="cuda")
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


def vllm_casts():
    """vLLM's per-channel (dynamic per-token) and per-tensor scaled_fp8_quant in torch on the GPU,
    the operations its test references compute to match its kernels (true divisions: the
    divisors are CUDA tensors, not host scalars)."""
    f448 = torch.tensor(448.0, device="cuda")
    one = torch.tensor(1.0, device="cuda")
    floor = (torch.tensor(1.0) / (torch.tensor(448.0) * torch.tensor(512.0))).cuda()

    def clamp_cast(y):
        return torch.fmax(torch.fmin(y, f448), -f448).to(torch.float8_e4m3fn)

    def channel(x):
        scale = torch.maximum(x.abs().float().amax(dim=-1, keepdim=True) / f448, floor)
        return clamp_cast(x.float() / scale), scale

    def tensor(x):
        scale = x.abs().float().max() / f448
        return clamp_cast(x.float() * (one / scale)), scale.view(1)

    return {"channel": channel, "tensor": tensor}


def torch_loop(pairs, params, scheme="block"):
    """pairs: (HF view, (engine name, expert index, row offset)); into params (fp8 + scales).
    Block and channel scales quantize each tensor; a per-tensor scale is one amax over every
    part of the parameter, so its parts are gathered into a bf16 copy of it first (as an engine
    quantizes after loading the bf16 parameter)."""
    cast = vllm_casts()

    def run():
        gathered = {}
        for x, (name, e, off) in pairs:
            dst = params[name] if e is None else params[name][e]
            if dst.dtype != torch.float8_e4m3fn:
                dst.copy_(x)
                continue
            sc = params[scale_name(name, scheme)]
            sc = sc if e is None else sc[e]
            if scheme == "tensor":
                key = (name, e)
                if key not in gathered:
                    gathered[key] = torch.empty(dst.shape, dtype=x.dtype, device="cuda")
                gathered[key][off: off + x.shape[0]].copy_(x)
                continue
            if scheme == "block":
                q, s = per_block_cast_to_fp8(x)
                sc[off // 128: off // 128 + s.shape[0]].copy_(s)
            else:
                q, s = cast["channel"](x)
                sc[off: off + x.shape[0]].copy_(s)
            dst[off: off + x.shape[0]].copy_(q)
        for (name, e), w in gathered.items():
            q, s = cast["tensor"](w)
            (params[name] if e is None else params[name][e]).copy_(q)
            sc = params[scale_name(name, "tensor")]
            (sc if e is None else sc[e]).copy_(s.view(sc.shape[1:] if e is not None else sc.shape))
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


SCHEMES = {"block": "128 x 128 block scales (weight_scale_inv), DeepGEMM's per_block_cast_to_fp8",
           "channel": "per-channel scales (weight_scale [R, 1]), vLLM's per-token quant",
           "tensor": "per-tensor scales (weight_scale [1] per parameter), vLLM's scaled_fp8_quant"}


PROFILED = 3  # requests profiled per fp8_one_pass row with --profile


def timeline(w, msg):
    """The GPU work of one request queued behind a sleep: (name, start ms, ms) per kernel or copy."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda._sleep(200_000_000)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        w.apply(msg)
        w.drain()
    ev = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA and "sleep" not in e.name),
                key=lambda e: e.time_range.start)
    if not ev:
        return []
    t0 = ev[0].time_range.start
    return [(e.name, (e.time_range.start - t0) / 1e3, (e.time_range.end - e.time_range.start) / 1e3) for e in ev]


def run_layout(layout, iters, schemes, profile=False):
    import wsync

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    per_mode = 2 * iters + 2 + (PROFILED if profile else 0)
    p = ctx.Process(target=trainer, args=(b, layout, per_mode * 2 * len(schemes) + 4 * 8), daemon=True)
    p.start()
    msgs, red = a.recv()
    it = iter(msgs)
    src = red[0](*red[1])
    hf, where, shapes = placement(layout)
    cfg = CFG if layout == "dense" else MOE_CFG
    pairs = [(v, where[n]) for n, v in flat_views(src, hf)]

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

    read = src.numel() * 2
    first_scheme = schemes[0]
    for scheme in schemes:
        ref = loop = None  # the last scheme's parameters, freed before this one's are made
        gc.collect()  # whatever the last layout left in a reference cycle (an EngineWorker was one)
        torch.cuda.empty_cache()
        ref = fp8_params(shapes, scheme=scheme)
        loop = torch_loop(pairs, ref, scheme)
        loop_ms = event_ms(loop, iters)
        written = sum(t.numel() * t.element_size() for t in ref.values())
        n_copy = (read + written) // 2
        bufs = [torch.empty(n_copy, dtype=torch.uint8, device="cuda") for _ in range(2)]
        limit_ms = event_ms(lambda bufs=bufs: bufs[1].copy_(bufs[0]), iters)
        bufs.clear()
        gb = (read + written) / 1e9
        print(f"{layout}, {SCHEMES[scheme]}: {len(hf)} bf16 tensors ({read / 1e9:.2f} GB) into {len(ref)} engine "
              f"parameters, {sum(t.dtype == torch.float8_e4m3fn for t in ref.values())} of them fp8 "
              f"({written / 1e9:.2f} GB written); median of {iters}")
        print(f"  limit: one cudaMemcpyAsync of {n_copy / 1e9:.2f} GB (reads + writes {gb:.2f} GB) {limit_ms:8.2f} ms")
        print(f"  torch per-tensor quantize + copy_ loop                       {loop_ms:8.2f} ms  "
              f"({limit_ms / loop_ms:.3f} of the limit)")
        if scheme == first_scheme:  # what the memory system gives this mix: 2 bytes read per byte written
            cast_dst = torch.empty(src.numel(), dtype=torch.float8_e4m3fn, device="cuda")
            cast_ms = event_ms(lambda d=cast_dst: d.copy_(src), iters)
            del cast_dst
            print(f"  torch's elementwise cast of the same bf16 to e4m3fn (no scales, one flat tensor) "
                  f"{cast_ms:8.2f} ms  ({limit_ms / cast_ms:.3f} of the limit: this read/write mix's rate)")
        results = {}
        for one_pass in (False, True):
            params = fp8_params(shapes, scheme=scheme)
            w = wsync.EngineWorker(params, engine="sglang", config=cfg, plugin=plugin(), fp8_one_pass=one_pass)
            ms, g = measure(w)
            same = differences(params, ref)
            what = "fp8_one_pass (check inside the one pass)" if one_pass else "NaN check before any write"
            print(f"  wsync, {what:40s}\n    {ms:8.2f} ms  ({limit_ms / ms:.3f} of the limit; "
                  f"{loop_ms / ms:.2f}x faster than the torch loop); GPU alone {g:.2f} ms ({limit_ms / g:.3f}); {same}")
            results.setdefault(one_pass, ms)
            if profile and one_pass:
                runs = [timeline(w, next(it)) for _ in range(PROFILED)]
                spans = [max((t + d for _, t, d in r), default=0.0) for r in runs]
                span = statistics.median(spans)
                print(f"    GPU timeline, first start to last end, median of {PROFILED} requests: {span:.3f} ms "
                      f"({limit_ms / span:.3f} of the limit; each {', '.join(f'{x:.3f}' for x in spans)} ms); the first:")
                for name, t, d in runs[0]:
                    print(f"      {t:8.3f} ms  {d:8.3f} ms  {name[:90]}")
            w.release()
            w.close()
            del params
        if layout == "moe" and scheme == "block":
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
        del ref
    a.send("done")
    p.join(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--layout", default="both", choices=("dense", "moe", "both"))
    ap.add_argument("--scales", default="block,channel,tensor",
                    help="comma-separated scale layouts of the fp8 parameters: block, channel, tensor")
    ap.add_argument("--profile", action="store_true", help="the GPU timeline of one fp8_one_pass request")
    args = ap.parse_args()
    schemes = [x for x in args.scales.split(",") if x]
    bad = [x for x in schemes if x not in SCHEMES]
    if bad:
        ap.error(f"--scales: unknown layout(s) {bad}; use {sorted(SCHEMES)}")
    for layout in ("dense", "moe"):
        if args.layout in (layout, "both"):
            run_layout(layout, args.iters, schemes, args.profile)


if __name__ == "__main__":
    main()
