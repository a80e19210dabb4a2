"""`wsync plan --fanout` checked by arithmetic written here: a 1T-parameter FP8 model (1e12
bytes) from 256 trainer GPUs to 32 replicas of TP 8 (every link 50 GB/s per GPU), and from 64
trainer GPUs, which can feed only 8 replicas at full rate, so the others pull from replicas in
chains of 4.

usage: python3 fanout_check.py PATH/TO/wsync   (exit 0 when every number agrees)
"""

import json
import math
import subprocess
import sys

M, R, TP, GBS, CHUNK = 1e12, 32, 8, 50e9, 256e6


def run(tool, trainer_gpus):
    out = subprocess.run([tool, "plan", "--fanout", "--model-bytes", str(M), "--trainer-gpus", str(trainer_gpus),
                          "--replicas", str(R), "--engine-tp", str(TP), "--json"],
                         check=True, capture_output=True, text=True).stdout
    print(out, end="")
    return json.loads(out.strip().splitlines()[-1])


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))  # the tool prints 9 digits


def main(tool):
    share = M / TP  # what each engine GPU receives
    chunks = math.ceil(share / CHUNK)
    hop = share / chunks / GBS
    bad = []
    for trainer_gpus, seeds in ((256, 32), (64, 8)):
        got = run(tool, trainer_gpus)
        bound = max(M / (trainer_gpus * GBS), share / GBS)
        chain = math.ceil(R / seeds)
        want = {"bound_s": bound, "seeds": seeds, "chain_len": chain, "chunks": chunks,
                "time_s": chunks * hop + (chain - 1) * hop, "join_s": share / GBS}
        bad += [f"{trainer_gpus} GPUs: {k} {got[k]} != {v}" for k, v in want.items() if not close(got[k], v)]
    if bad:
        print("fanout_check: FAIL:", "; ".join(bad))
        return 1
    print("fanout_check: every number agrees")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
