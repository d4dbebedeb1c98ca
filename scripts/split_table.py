#!/usr/bin/env python3
"""The split-execution targets table: for each of the nine light models
(random-weight variants in .testdata) at batch 1 and 8, the whole-op arena,
the arena with `--min-memory` (its extra FLOPs and splits) and with
`--memory-limit` at 0.7x the best peer, against the best peer's figure
(ONNX Runtime's optimized memory pattern or XLA's CPU temp buffers, fp32,
as measured when issue 17 was filed). Prints a Markdown table and the
geometric mean of smelt's `--min-memory` arena over the best peer's.

    scripts/split_table.py [--smelt target/debug/smelt] [--batches 1,8] [MODEL ...]
"""

import argparse
import json
import math
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
# Best peer arena in MiB at batch 1 and 8 (issue 17's table).
PEER = {
    "resnet50": (6.9, 55.1),
    "densenet121": (7.0, 55.3),
    "inception_v1": (4.4, 35.5),
    "inception_v2": (3.8, 30.6),
    "shufflenet": (2.9, 22.9),
    "squeezenet": (3.7, 30.0),
    "vgg19": (24.5, 196.0),
    "bvlc_alexnet": (2.1, 17.1),
    "zfnet512": (8.7, 69.6),
}


def plan(smelt, model, batch, *flags):
    path = ROOT / ".testdata" / "variants" / model / "model.onnx"
    t = time.time()
    p = subprocess.run([smelt, "plan", str(path), "--batch", str(batch), "--json", *flags], capture_output=True, text=True)
    secs = time.time() - t
    if p.returncode != 0:
        return None, secs, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    return json.loads(p.stdout), secs, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", default=str(ROOT / "target" / "debug" / "smelt"))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("models", nargs="*", default=list(PEER))
    a = ap.parse_args()
    print("| model | batch | best peer MiB | whole-op MiB | --min-memory MiB | / peer | extra FLOPs | splits | s | limit 0.7x peer MiB | arena MiB | fits | extra FLOPs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for m in a.models:
        for b in [int(x) for x in a.batches.split(",")]:
            peer = PEER[m][0 if b == 1 else 1]
            d, secs, err = plan(a.smelt, m, b, "--min-memory")
            if d is None:
                print(f"| {m} | {b} | {peer} | error: {err} |")
                continue
            s = d["split"] or {}
            arena = d["plan"]["arena_bytes"] / MIB
            whole = s.get("arena_before", d["plan"]["arena_bytes"]) / MIB
            extra = s.get("extra_flops", 0) / max(1, s.get("flops_before", 1))
            splits = ", ".join(f"{x['how']} x{x['parts']}" for x in s.get("splits", []))
            ratios.append(arena / peer)
            limit = int(peer * 0.7 * MIB)
            dl, _, errl = plan(a.smelt, m, b, "--memory-limit", f"{limit}B")
            if dl is None:
                lim = f"{limit / MIB:.2f} | - | no ({errl}) | -"
            else:
                sl = dl["split"] or {}
                al = dl["plan"]["arena_bytes"]
                el = sl.get("extra_flops", 0) / max(1, sl.get("flops_before", 1))
                lim = f"{limit / MIB:.2f} | {al / MIB:.2f} | {'yes' if al <= limit else 'no'} | {100 * el:.1f}%"
            print(f"| {m} | {b} | {peer} | {whole:.2f} | {arena:.2f} | {arena / peer:.3f} | {100 * extra:.1f}% | {splits} | {secs:.1f} | {lim} |")
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"\ngeometric mean of --min-memory arena / best peer over {len(ratios)} cases: {g:.3f}")


if __name__ == "__main__":
    main()
