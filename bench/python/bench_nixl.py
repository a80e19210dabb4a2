"""NIXL benchmark (a program, not a test): a trainer process and an engine process, the engine
pulling each version over NIXL (UCX's lanes; on one host shared memory or CMA). Prints ratios
against a baseline run in the same processes, in the same run:

  the limit: NIXL's own READ of the same bytes (one transfer from a buffer the trainer
  registered into one the engine registered, through the nixl Python API);
  wsync, engine side: from a bucket request's arrival to its reply (the pull straight into the
  engine's fused parameters, the control checks, *consumed* written back), summed over a sync;
  wsync, whole sync: the trainer's Producer.sync wall time (stage into the registered staging
  buffers, two sets: bucket k+1 staged while the engine pulls bucket k, the replies read when
  the Producer asks for them; every request and reply).

A Qwen3-shaped dense model (--layers, --hidden) in bf16, SGLang's layout, TP 1, CPU plugin.

  usage: python bench/python/bench_nixl.py [--layers 8] [--hidden 1024] [--bucket-mb 64] [--iters 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def config(layers: int, hidden: int) -> dict:
    return {"hidden_size": hidden, "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 256),
            "head_dim": 64, "intermediate_size": 3 * hidden, "vocab_size": 32000, "num_hidden_layers": layers}


def hf_shapes(cfg: dict) -> dict:
    H, NH, KV, HD, FF, V = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                             "head_dim", "intermediate_size", "vocab_size"))
    s = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s |= {p + "self_attn.q_proj.weight": (NH * HD, H), p + "self_attn.k_proj.weight": (KV * HD, H),
              p + "self_attn.v_proj.weight": (KV * HD, H), p + "self_attn.o_proj.weight": (H, NH * HD),
              p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
              p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
              p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H),
              p + "mlp.down_proj.weight": (H, FF)}
    return s | {"model.norm.weight": (H,), "lm_head.weight": (V, H)}


def engine_shapes(cfg: dict) -> dict:
    NH, KV, HD, FF = (cfg[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    out = {}
    for n, s in hf_shapes(cfg).items():
        if n.endswith("q_proj.weight"):
            out[n.replace("q_proj", "qkv_proj")] = ((NH + 2 * KV) * HD, s[1])
        elif n.endswith("gate_proj.weight"):
            out[n.replace("gate_proj", "gate_up_proj")] = (2 * FF, s[1])
        elif not n.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[n] = s
    return out


def nixl_agent(name: str):
    from nixl_cu12 import nixl_agent as agent
    from nixl_cu12 import nixl_agent_config

    return agent(name, nixl_agent_config(backends=["UCX"]))


def engine(conn, cfg: dict) -> None:
    import torch
    import wsync

    params = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in engine_shapes(cfg).items()}
    w = wsync.EngineWorker(params, engine="sglang", config=cfg)
    total = sum(t.nbytes for t in params.values())
    # the baseline's destination, and its agent
    raw = torch.zeros(total, dtype=torch.uint8)  # its pages made before any transfer
    ag = nixl_agent("bench-engine")
    ag.register_memory(ag.get_reg_descs([(raw.data_ptr(), total, 0, "")], "DRAM"))
    conn.send(("ready", total))
    pulled = 0.0
    while True:
        op, arg = conn.recv()
        if op == "msg":
            t = time.perf_counter()
            reply = w.handle(arg)
            pulled += time.perf_counter() - t  # every request of a sync carries a bucket
            conn.send(reply)
        elif op == "pulled":
            conn.send(pulled)
            pulled = 0.0
        elif op == "raw":
            md, addr = arg
            peer = ag.add_remote_agent(md)
            local = ag.get_xfer_descs([(raw.data_ptr(), total, 0)], "DRAM")
            remote = ag.get_xfer_descs([(addr, total, 0)], "DRAM")
            times = []
            for _ in range(conn.recv()):
                t = time.perf_counter()
                h = ag.initialize_xfer("READ", local, remote, peer)
                st = ag.transfer(h)
                while st == "PROC":
                    st = ag.check_xfer_state(h)
                times.append(time.perf_counter() - t)
                ag.release_xfer_handle(h)
                assert st == "DONE", st
            conn.send(times)
        else:
            w.close()
            conn.send("bye")
            return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--direct", action="store_true", help="the engine pulls the trainer's tensors in place")
    a = ap.parse_args()
    import torch
    import wsync

    cfg = config(a.layers, a.hidden)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    p = ctx.Process(target=engine, args=(child, cfg), daemon=True)
    p.start()
    op, total = conn.recv()
    g = torch.Generator().manual_seed(0)
    sd = {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in hf_shapes(cfg).items()}
    nbytes = sum(t.nbytes for t in sd.values())

    def send(m):  # the replies are read when the Producer asks: it stages the next bucket first
        conn.send(("msg", m))
        return conn.recv

    syncs, pulls = [], []
    with wsync.Producer("sglang", bucket_bytes=a.bucket_mb << 20, transport="nixl", direct=a.direct) as prod:
        for k in range(a.iters + 1):
            for t in sd.values():
                t.add_(1)
            t0 = time.perf_counter()
            n = prod.sync(sd, send)
            prod.wait()
            dt = time.perf_counter() - t0
            conn.send(("pulled", None))
            pulled = conn.recv()
            if k > 0:  # the first sync registers the parameters and connects
                syncs.append(dt)
                pulls.append(pulled)
    # the baseline: one READ of the same bytes between the same two processes
    src = torch.full((total,), 7, dtype=torch.uint8)
    ag = nixl_agent("bench-trainer")
    ag.register_memory(ag.get_reg_descs([(src.data_ptr(), total, 0, "")], "DRAM"))
    conn.send(("raw", (ag.get_agent_metadata(), src.data_ptr())))
    conn.send(a.iters + 1)
    raw = conn.recv()[1:]
    conn.send(("close", None))
    conn.recv()
    p.join(30)

    def med(x):
        return sorted(x)[len(x) // 2]

    gbs = lambda s: nbytes / s / 1e9  # noqa: E731
    mode = "direct (the trainer's tensors in place)" if a.direct else "staged (two buffer sets)"
    print(f"model: Qwen3-shaped dense, {a.layers} layers, hidden {a.hidden}: {len(sd)} tensors, "
          f"{nbytes / 1e6:.0f} MB bf16; {n} buckets of <= {a.bucket_mb} MiB, {mode}; median of {a.iters}")
    print(f"  NIXL READ of the same bytes (the limit) {med(raw) * 1e3:8.1f} ms  {gbs(med(raw)):6.2f} GB/s  1.000")
    print(f"  wsync engine side (pull + checks)       {med(pulls) * 1e3:8.1f} ms  {gbs(med(pulls)):6.2f} GB/s  "
          f"{med(raw) / med(pulls):.3f}")
    print(f"  wsync whole sync                        {med(syncs) * 1e3:8.1f} ms  {gbs(med(syncs)):6.2f} GB/s  "
          f"{med(raw) / med(syncs):.3f}")


if __name__ == "__main__":
    main()
