#!/usr/bin/env python3
"""The GPU check's driver (called by scripts/gpu-check.sh on a GPU machine).

1. Correctness: each light model (as shipped, against its expected output)
   and each random-weight variant (against smelt's CPU reference and
   onnxruntime's output) on `smelt run --backend cuda`, f32 and mixed-f16.
2. Speed and memory: ResNet-50 at batch 1 and 32, smelt (CUDA, f32 and
   mixed-f16) against PyTorch (torchvision resnet50 with random weights, or
   an identical local definition when torchvision is missing), eager and
   torch.compile: median latency and peak device memory
   (torch.cuda.max_memory_allocated; for smelt the arena plus the weights,
   its only device allocations).
Prints one Markdown table per part and exits 1 on any mismatch or error.

--quick (about three minutes): the nine variants at f32 only, and ResNet-50
at batch 32 only. --list-compiles prints every (model, precision, batch)
the check runs, for `gpu-check.sh --prepare` to compile in advance.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"]


FAILURES = []


def shipped(a, m):
    return os.path.join(a.data, "light", f"light_{m}.onnx")


def variant(a, m):
    return os.path.join(a.variants, m, "model.onnx")


def precisions(a):
    return ["f32"] if a.quick else ["f32", "mixed-f16"]


def speed_batches(a):
    return [32] if a.quick else [1, 32]


def compiles(a):
    """Every (model, precision, batch) a run of the check compiles (quick or not)."""
    out = [(variant(a, "resnet50"), "f32", 1)]  # the probe
    for m in MODELS:
        out.append((shipped(a, m), "f32", 1))
        out += [(variant(a, m), p, 1) for p in ["f32", "mixed-f16"]]
    out += [(variant(a, "resnet50"), p, b) for b in [1, 32] for p in ["f32", "mixed-f16"]]
    return out


def smelt(exe, args, timeout=240):
    t = time.time()
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if out.returncode not in (0, 1):
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        FAILURES.append(f"smelt {' '.join(args[:2])}: {why}")
        return None, why
    try:
        return json.loads(out.stdout), f"{time.time() - t:.1f} s"
    except json.JSONDecodeError:
        return None, "no JSON: " + out.stderr[-300:]


def cmp_cell(v, what):
    if v is None:
        return what if what == "-" else f"error: {what}"
    o = v["outputs"][0]
    c = o.get("comparison") or {}
    state = "ok" if v["ok"] else "MISMATCH"
    if not v["ok"]:
        FAILURES.append(f"{what}: mismatch")
    return f"{state} (max abs {c.get('max_abs', float('nan')):.1e})"


def correctness(a):
    print("## CUDA against the references\n")
    print("| model | precision | as shipped vs expected | variant vs smelt CPU | variant vs onnxruntime | CUDA median ms (b1) | device memory MiB |")
    print("|---|---|---|---|---|---|---|")
    tmp = tempfile.mkdtemp()
    for m in MODELS:
        expect = os.path.join(a.data, "light", f"light_{m}_output_0.pb")
        var = os.path.join(a.variants, m)
        for p in precisions(a):
            tol = ["--rtol", "1e-3", "--atol", "1e-4"] if p == "f32" else ["--rtol", "5e-2", "--atol", "1e-2"]
            # onnxruntime's and the shipped outputs are f32: compared at f32 only.
            s, why_s = (smelt(a.smelt, ["run", shipped(a, m), "--backend", "cuda", "--expect", expect, "--json", "--repeat", "5", *tol])
                        if p == "f32" else (None, "-"))
            cpu_dir = os.path.join(tmp, f"{m}_{p}")
            smelt(a.smelt, ["run", os.path.join(var, "model.onnx"), "--input", os.path.join(var, "input_0.pb"), "--precision", p, "--save-outputs", cpu_dir, "--json"])
            c, why_c = smelt(a.smelt, ["run", os.path.join(var, "model.onnx"), "--backend", "cuda", "--precision", p, "--input", os.path.join(var, "input_0.pb"),
                                       "--expect", os.path.join(cpu_dir, "output_0.pb"), "--json", "--repeat", "20", *tol])
            o, why_o = (smelt(a.smelt, ["run", os.path.join(var, "model.onnx"), "--backend", "cuda", "--input", os.path.join(var, "input_0.pb"),
                                        "--expect", os.path.join(var, "output_0.pb"), "--json", "--repeat", "5", *tol])
                        if p == "f32" else (None, "-"))
            ms = f"{c['median_ms']:.3f}" if c else "-"
            mem = f"{c['device_bytes'] / 2**20:.1f}" if c else "-"
            print(f"| {m} | {p} | {cmp_cell(s, why_s)} | {cmp_cell(c, why_c)} | {cmp_cell(o, why_o)} | {ms} | {mem} |", flush=True)


def local_resnet50(torch):
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def bench_torch(torch, batch, mode, iters=30):
    try:
        import torchvision
        model = torchvision.models.resnet50(weights=None)
    except Exception:
        model = local_resnet50(torch)
    model = model.cuda().eval()
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    t0 = time.time()
    if mode == "torch.compile":
        model = torch.compile(model)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        prep = time.time() - t0
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            model(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        peak = torch.cuda.max_memory_allocated()
    times.sort()
    return times[len(times) // 2], peak, weights, prep


def speed(a):
    print("\n## ResNet-50: latency and peak device memory\n")
    print("| engine | batch | median ms | peak device MiB | of which weights MiB | activations and workspace MiB | setup s |")
    print("|---|---|---|---|---|---|---|")
    model = os.path.join(a.variants, "resnet50", "model.onnx")
    for batch in speed_batches(a):
        for p in precisions(a):
            v, why = smelt(a.smelt, ["run", model, "--batch", str(batch), "--backend", "cuda", "--precision", p, "--json", "--repeat", "50"])
            if v is None:
                print(f"| smelt {p} | {batch} | error: {why} | | | | |", flush=True)
                continue
            print(f"| smelt {p} | {batch} | {v['median_ms']:.3f} | {v['device_bytes'] / 2**20:.1f} | {v['weights_bytes'] / 2**20:.1f} | "
                  f"{v['arena_bytes'] / 2**20:.1f} (arena) | {why} |", flush=True)
    try:
        import torch
    except Exception as e:
        print(f"| PyTorch | - | not available: {e} | | | | |")
        return
    for batch in speed_batches(a):
        for mode in ["eager", "torch.compile"]:
            try:
                ms, peak, weights, prep = bench_torch(torch, batch, mode)
                print(f"| PyTorch {torch.__version__} {mode} | {batch} | {ms:.3f} | {peak / 2**20:.1f} | {weights / 2**20:.1f} | {(peak - weights) / 2**20:.1f} | {prep:.1f} |", flush=True)
            except Exception as e:
                print(f"| PyTorch {mode} | {batch} | failed: {str(e).splitlines()[0][:80]} | | | | |", flush=True)
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--quick", action="store_true", help="f32 only, ResNet-50 at batch 32 only (about three minutes)")
    ap.add_argument("--list-compiles", action="store_true", help="print MODEL PRECISION BATCH per line for --prepare, then exit")
    a = ap.parse_args()
    if a.list_compiles:
        for m, p, b in compiles(a):
            print(m, p, b)
        return
    t = time.time()
    # First contact: one run that synchronises after every launch, so a
    # device fault names its kernel.
    probe = subprocess.run([a.smelt, "run", variant(a, "resnet50"), "--backend", "cuda", "--repeat", "1", "--sync"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"gpu-check: smelt cannot use the GPU: {probe.stderr.strip()}")
    print(probe.stdout.strip().splitlines()[0] if probe.stdout.strip() else "", file=sys.stderr)
    if not a.skip_correctness:
        correctness(a)
    speed(a)
    print(f"\ngpu-check finished in {time.time() - t:.0f} s", file=sys.stderr)
    if FAILURES:
        print(f"gpu-check: {len(FAILURES)} failures:", *FAILURES, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
