#!/usr/bin/env python3
"""The mixed-precision table over the random-weight variants of the nine
light models: arena and weight bytes at f32, mixed-f16 and mixed-bf16 (from
`smelt plan --json`), and the error of each against f32 on the CPU executor
(`smelt run --json`), which computes f16/bf16 as the kernels do.

Inputs: the variant's own test image (batch 1) and, for the arg-max
agreement, a batch of 8 seeded standard-normal images run at --batch 8.

Usage: scripts/precision-table.py [--smelt target/release/smelt] [--testdata .testdata] [--batch 8] [name ...]
Prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"]


def smelt(exe, *args):
    out = subprocess.run([exe, *args], capture_output=True, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"smelt {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", default="target/release/smelt")
    ap.add_argument("--testdata", default=".testdata")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("models", nargs="*", default=MODELS)
    a = ap.parse_args()
    mib = lambda b: f"{b / 2**20:.2f}"
    print("| model | f32 arena MiB | mixed-f16 arena | mixed-bf16 arena | f16 / f32 arena | f32 weights MiB | mixed-f16 weights | mixed-bf16 weights "
          "| cast kernels | f16 max abs err (of range), image | bf16 max abs err (of range), image "
          f"| f16 arg-max agree, {a.batch} random | bf16 arg-max agree, {a.batch} random |")
    print("|" + "---|" * 13)
    tmp = tempfile.mkdtemp()
    for name in a.models:
        d = os.path.join(a.testdata, "variants", name)
        model = os.path.join(d, "model.onnx")
        plans = {p: smelt(a.smelt, "plan", model, "--precision", p, "--json")["plan"] for p in ["f32", "mixed-f16", "mixed-bf16"]}
        # The variant's image.
        img = {p: smelt(a.smelt, "run", model, "--input", os.path.join(d, "input_0.pb"), "--precision", p, "--json")["outputs"][0]["against_f32"]
               for p in ["mixed-f16", "mixed-bf16"]}
        # A batch of random images.
        x = numpy_helper.to_array(onnx.load_tensor(os.path.join(d, "input_0.pb")))
        rng = np.random.default_rng(7)
        xb = rng.standard_normal((a.batch, *x.shape[1:])).astype(np.float32)
        path = os.path.join(tmp, f"{name}_b{a.batch}.pb")
        with open(path, "wb") as f:
            f.write(numpy_helper.from_array(xb, "x").SerializeToString())
        rnd = {p: smelt(a.smelt, "run", model, "--batch", str(a.batch), "--input", path, "--precision", p, "--json")["outputs"][0]["against_f32"]
               for p in ["mixed-f16", "mixed-bf16"]}
        f32, h, b = plans["f32"], plans["mixed-f16"], plans["mixed-bf16"]
        err = lambda e: f"{e['max_abs']:.2e} ({e['max_abs_over_range']:.1e})"
        agree = lambda e: f"{e['argmax_agree']}/{e['rows']}"
        print(f"| {name} | {mib(f32['arena_bytes'])} | {mib(h['arena_bytes'])} | {mib(b['arena_bytes'])} | {h['arena_bytes'] / f32['arena_bytes']:.3f} "
              f"| {mib(f32['weights_bytes'])} | {mib(h['weights_bytes'])} | {mib(b['weights_bytes'])} | {h['cast_kernels']} "
              f"| {err(img['mixed-f16'])} | {err(img['mixed-bf16'])} | {agree(rnd['mixed-f16'])} | {agree(rnd['mixed-bf16'])} |", flush=True)


if __name__ == "__main__":
    main()
