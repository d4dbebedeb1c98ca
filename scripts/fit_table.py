#!/usr/bin/env python3
"""The `smelt fit` targets table: for each model, a training step (Adam) at
a batch, its arena without recomputation, and `smelt fit` at a memory limit
of the persistent bytes plus half that arena (f32): the recipe chosen, the
recomputation's FLOPs against the forward pass's, the decision time; and
the smallest arena recomputation reaches at that batch (`smelt plan
--remat-budget 1`).

    scripts/fit_table.py [--smelt target/release/smelt] [--batch 32] [--remat-solver greedy|exact] [MODEL ...]

With no MODEL: the nine light models (from .testdata), zoo:resnet50,
zoo:bert_base (sequence 128) and zoo:bert_large (sequence 512). Prints a
Markdown table.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIGHT = ["resnet50", "densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet", "vgg19", "bvlc_alexnet", "zfnet512"]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def extra_args(model):
    if model == "zoo:bert_base":
        return ["--dim", "sequence=128", "--loss", "mse"]
    if model == "zoo:bert_large":
        return ["--dim", "sequence=512", "--loss", "mse"]
    return []


def mib(b):
    return f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", default=str(ROOT / "target/release/smelt"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--remat-solver", default="greedy", choices=["greedy", "exact"])
    ap.add_argument("models", nargs="*")
    a = ap.parse_args()
    models = a.models or [str(ROOT / f".testdata/onnx-data/light/light_{m}.onnx") for m in LIGHT] + ["zoo:resnet50", "zoo:bert_base", "zoo:bert_large"]
    print(f"| model | batch | arena (MiB) | persistent (MiB) | limit (MiB) | recipe | recomputed kernels | recompute / forward FLOPs | decision (s) | remat floor / arena |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        b = str(a.batch)
        ex = extra_args(model)
        name = Path(model).stem.removeprefix("light_") if model.endswith(".onnx") else model
        rc, out, err = run([a.smelt, "fit", model, "--train", "adam", "--batch", b, "--memory-limit", "1TB", "--json", *ex])
        if rc != 0:
            print(f"| {name} | {b} | error: {err.strip().splitlines()[-1]} |||||||")
            continue
        plain = json.loads(out)["chosen"]
        arena, persistent = plain["arena_bytes"], plain["persistent_bytes"]
        limit = persistent + arena // 2
        t = time.time()
        rc, out, err = run([a.smelt, "fit", model, "--train", "adam", "--batch", b, "--memory-limit", str(limit), "--json", "--remat-solver", a.remat_solver, *ex])
        wall = time.time() - t
        if rc == 0:
            f = json.loads(out)
            c = f["chosen"]
            recipe = f"{c['micro_batch']} x {c['accumulate']}, {c['precision']}"
            kernels = len(c["remat"]["recomputed"]) if c["remat"] else 0
            frac = f"{c['recompute_flops'] / max(c['forward_flops'], 1):.3f}"
            decided = f"{f['decision_seconds']:.1f}"
        else:
            recipe, kernels, frac, decided = "none fits: " + err.strip().splitlines()[-1], "-", "-", f"{wall:.1f}"
        rc, out, err = run([a.smelt, "plan", model, "--train", "adam", "--batch", b, "--remat-budget", "1", *ex])
        m = re.search(r"the smallest is (\d+) bytes", err)
        floor = f"{int(m.group(1)) / arena:.3f}" if m else "?"
        print(f"| {name} | {b} | {mib(arena)} | {mib(persistent)} | {mib(limit)} | {recipe} | {kernels} | {frac} | {decided} | {floor} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
