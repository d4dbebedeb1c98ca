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
   BERT-base at batch 8, sequence 128, mixed-f16, against PyTorch's
   nn.TransformerEncoder of the same sizes under autocast f16.
   With --vision, torchvision's models (scripts/make_vision.py) at batch 1
   and 2 under TF32, mixed-f16 and mixed-bf16: every kernel against its
   description and the CPU reference executor, the logits against
   onnxruntime's, the first inf or NaN named.
3. Training (`smelt train --backend cuda`): the MLP and CNN of
   scripts/make_train_runs.py after 20 steps (SGD, Adam, SGD with
   accumulation) against PyTorch's weights (rtol 1e-4); ResNet-50 at batch
   32 with Adam on generated data, ms per step and device memory, against
   PyTorch eager and torch.compile training steps (frozen batch norm, as
   smelt's default; torch.cuda.max_memory_allocated).
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
# --budget: the wall-clock second after which no new part starts (a lent GPU
# gives minutes; the torch.compile rows, the slowest, come last).
DEADLINE = float("inf")
SKIPPED = []


def left():
    return DEADLINE - time.time()


def out_of_time(what):
    """True (and noted) when the budget is spent before `what` starts."""
    if left() > 0:
        return False
    SKIPPED.append(what)
    return True


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
    out.append(("zoo:bert_base", "mixed-f16", 8))  # sequence 128, the zoo's default
    return out


# (reference run, smelt train's options) for scripts/make_train_runs.py's references.
TRAIN_RUNS = [
    ("sgd", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]),
    ("adam", ["--optimizer", "adam", "--lr", "0.01"]),
    ("sgd_acc4", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--accumulate", "4"]),
]
RESNET_TRAIN = ["zoo:resnet50", "--optimizer", "adam", "--lr", "0.001", "--batch", "32"]
# ResNet-50's training step runs at these precisions (PyTorch: f32, and bf16 autocast).
TRAIN_PRECISIONS = ["f32", "mixed-bf16"]


def train_compiles(runs):
    """`smelt compile` argument lists that fill the cache with the training check's kernels."""
    out = []
    for model in ["mlp", "cnn"]:
        for _, opts in TRAIN_RUNS:
            out.append([os.path.join(runs, model, "model.onnx"), "--batch", "32", "--tf32", "off", *[o.replace("--optimizer", "--train") for o in opts]])
    out += [[o.replace("--optimizer", "--train") for o in RESNET_TRAIN] + ["--precision", p] for p in TRAIN_PRECISIONS]
    return out


def smelt(exe, args, timeout=240):
    t = time.time()
    timeout = max(30, min(timeout, left() + 60))
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        FAILURES.append(f"smelt {' '.join(args[:2])}: timed out after {timeout:.0f} s")
        return None, f"timed out after {timeout:.0f} s"
    if out.returncode not in (0, 1):
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        FAILURES.append(f"smelt {' '.join(args[:2])}: {why}")
        return None, why
    try:
        return json.loads(out.stdout), f"{time.time() - t:.1f} s"
    except json.JSONDecodeError:
        FAILURES.append(f"smelt {' '.join(args[:2])}: no JSON")
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
        if out_of_time(f"correctness of {m}"):
            continue
        expect = os.path.join(a.data, "light", f"light_{m}_output_0.pb")
        var = os.path.join(a.variants, m)
        for p in precisions(a):
            # f32 is checked exact (--tf32 off); its speed row runs TF32 convs, as PyTorch does.
            tol = ["--rtol", "1e-3", "--atol", "1e-4", "--tf32", "off"] if p == "f32" else ["--rtol", "5e-2", "--atol", "1e-2"]
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


def torch_resnet50(torch):
    """torchvision's ResNet-50 with random weights (or the same, defined here), on the GPU, in eval mode."""
    try:
        import torchvision
        model = torchvision.models.resnet50(weights=None)
    except Exception:
        model = local_resnet50(torch)
    return model.cuda().eval()


def median_ms(torch, fn, iters):
    """The median time of `fn()` in ms, by CUDA events."""
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def bench_torch(torch, batch, mode, iters=30):
    """`mode`: eager, torch.compile, or `eager channels-last autocast
    float16` (cuDNN on tensor cores: what smelt's mixed-f16 must match)."""
    model = torch_resnet50(torch)
    tc = "autocast" in mode
    if tc:
        model = model.to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    if tc:
        x = x.to(memory_format=torch.channels_last)
    t0 = time.time()
    if mode == "torch.compile":
        model = torch.compile(model)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=tc):
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        prep = time.time() - t0
        torch.cuda.reset_peak_memory_stats()
        ms = median_ms(torch, lambda: model(x), iters)
        peak = torch.cuda.max_memory_allocated()
    return ms, peak, weights, prep


def speed(a):
    print("\n## ResNet-50: latency and peak device memory\n")
    print("| engine | batch | median ms | peak device MiB | of which weights MiB | activations and workspace MiB | setup s |")
    print("|---|---|---|---|---|---|---|")
    model = os.path.join(a.variants, "resnet50", "model.onnx")
    for batch in speed_batches(a):
        for p in precisions(a):
            if out_of_time(f"smelt {p} at batch {batch}"):
                continue
            v, why = smelt(a.smelt, ["run", model, "--batch", str(batch), "--backend", "cuda", "--precision", p, "--json", "--repeat", "50"])
            if v is None:
                print(f"| smelt {p} | {batch} | error: {why} | | | | |", flush=True)
                continue
            label = "f32 (TF32 convs, as PyTorch's default)" if p == "f32" else p
            print(f"| smelt {label} | {batch} | {v['median_ms']:.3f} | {v['device_bytes'] / 2**20:.1f} | {v['weights_bytes'] / 2**20:.1f} | "
                  f"{v['arena_bytes'] / 2**20:.1f} (arena) | {why} |", flush=True)
    try:
        import torch
    except Exception as e:
        print(f"| PyTorch | - | not available: {e} | | | | |")
        return
    for batch in speed_batches(a):
        torch_inference_row(torch, batch, "eager")
        if not a.quick:
            torch_inference_row(torch, batch, "eager channels-last autocast float16")


def tuning(a):
    """`smelt tune` on ResNet-50 (batch 32, mixed-f16): every tensor-core
    conv timed with each candidate tile, then the model's tiles against the
    measured ones, end to end."""
    print("\n## ResNet-50 batch 32 mixed-f16: tiles measured by `smelt tune`\n")
    if out_of_time("smelt tune"):
        return
    model = os.path.join(a.variants, "resnet50", "model.onnx")
    common = [model, "--batch", "32", "--precision", "mixed-f16"]
    table = os.path.join(tempfile.mkdtemp(prefix="smelt-tune-"), "tuning.json")
    v, why = smelt(a.smelt, ["tune", *common, "--backend", "cuda", "--runs", "10", "--out", table, "--json"], timeout=420)
    if v is None:
        print(f"smelt tune: error: {why}")
        return
    changed = [k for k in v["kernels"] if k["tuned"] != k["model"]]
    print(f"{len(v['kernels'])} kernels timed ({why}); {len(changed)} take another tile than the model's; "
          f"kernel time per run: model's tiles {v['model_ms']:.3f} ms, tuned {v['tuned_ms']:.3f} ms\n")
    print("| kernel | launches | 64x64 | 128x64 | 64x128 | 128x128 | model | tuned |")
    print("|---|---|---|---|---|---|---|---|")
    for k in sorted(v["kernels"], key=lambda k: -k["ms"][k["model"]])[:12]:
        ms = " | ".join(f"{k['ms'][t]:.4f}" for t in ["64x64", "128x64", "64x128", "128x128"])
        print(f"| {k['kernel']} | {k['launches']} | {ms} | {k['model']} | {k['tuned']} |")
    print("\n| tiles | median ms (50 runs) |")
    print("|---|---|")
    for label, extra in [("the model's", []), ("tuned", ["--tuning", table])]:
        r, why = smelt(a.smelt, ["run", *common, "--backend", "cuda", "--repeat", "50", "--json", *extra])
        print(f"| {label} | {r['median_ms']:.3f} |" if r else f"| {label} | error: {why} |", flush=True)


VISION = ["resnet18", "resnet34", "resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit"]
# (precision, smelt flags, tolerance of the logits against onnxruntime's f32 as
# a fraction of their range: TF32 and f16 keep 10 mantissa bits, bf16 7; the
# budgets tests/emulator.rs holds the emulator to).
VISION_PRECISIONS = [("tf32", ["--precision", "f32"], 5e-3), ("mixed-f16", ["--precision", "mixed-f16"], 5e-3),
                     ("mixed-bf16", ["--precision", "mixed-bf16"], 3e-2)]


def vision_compiles(vision):
    """`smelt compile` argument lists of the vision part (scripts/make_vision.py's models)."""
    return [[os.path.join(vision, m, "model.onnx"), "--batch", str(b), *flags]
            for m in VISION for b in (1, 2) for _, flags, _ in VISION_PRECISIONS]


def vision(a):
    """torchvision's models (scripts/make_vision.py: full width, 64x64 images)
    at batch 1 and 2 on the GPU under the GPU defaults (TF32 convolutions),
    mixed-f16 and mixed-bf16: every kernel against its description and the
    CPU reference executor (--check-kernels), the first inf or NaN named
    (--check-finite), the logits against onnxruntime's f32."""
    import numpy as np
    from onnx import TensorProto, numpy_helper
    print("\n## torchvision's models on the GPU (issue 43)\n")
    print("| model | batch | precision | kernels vs description | kernels vs reference (worst of range) | logits vs onnxruntime (of range) | non-finite |")
    print("|---|---|---|---|---|---|---|")
    for m in VISION:
        if out_of_time(f"the vision check of {m}"):
            continue
        d = os.path.join(a.vision, m)
        for b in (1, 2):
            for name, flags, tol in VISION_PRECISIONS:
                v, why = smelt(a.smelt, ["run", os.path.join(d, "model.onnx"), "--batch", str(b), "--backend", a.vision_backend, *flags,
                                         "--input", os.path.join(d, f"input_b{b}.pb"), "--expect", os.path.join(d, f"output_b{b}.pb"),
                                         "--rtol", "0", "--atol", "1e30", "--check-kernels", "--repeat", "1", "--json",
                                         *(["--check-finite"] if a.vision_backend == "cuda" else [])])
                if v is None:
                    print(f"| {m} | {b} | {name} | error: {why} | | | |", flush=True)
                    continue
                checks = v.get("kernel_checks") or []
                desc = [c for c in checks if c["against"] == "description"]
                ref = [c for c in checks if c["against"] == "reference"]
                bad_desc = [c["kernel"] for c in desc if not c["ok"]]
                bad_ref = [c["kernel"] for c in ref if not c["ok"]]
                worst = max((c["of_range"] for c in ref), default=float("nan"))
                c = v["outputs"][0]["comparison"]
                t = TensorProto()
                with open(os.path.join(d, f"output_b{b}.pb"), "rb") as f:
                    t.ParseFromString(f.read())
                of_range = c["max_abs"] / float(np.abs(numpy_helper.to_array(t)).max())
                nf = v.get("non_finite")
                if bad_desc or bad_ref or of_range > tol or nf:
                    FAILURES.append(f"vision {m} batch {b} {name}: kernels {bad_desc + bad_ref}, logits {of_range:.1e} of range, non-finite {nf}")
                print(f"| {m} | {b} | {name} | {len(desc) - len(bad_desc)}/{len(desc)} agree | {len(ref) - len(bad_ref)}/{len(ref)} agree ({worst:.1e})"
                      f" | {of_range:.1e} ({'ok' if of_range <= tol else 'OVER ' + str(tol)}) | {nf['kernel'] if nf else '-'} |", flush=True)


def transformer(a):
    """BERT-base at batch 8, sequence 128, mixed-f16 (attention fused on
    tensor cores) against PyTorch's nn.TransformerEncoder of the same sizes
    (12 post-norm layers, hidden 768, 12 heads, FFN 3072, GELU) under
    autocast f16, whose inference path runs scaled_dot_product_attention
    (FlashAttention) and cuBLAS on tensor cores. smelt's model has its
    embeddings too (a gather and two adds)."""
    print("\n## BERT-base (batch 8, sequence 128): latency\n")
    print("| engine | precision | median ms | peak device MiB |")
    print("|---|---|---|---|")
    if not out_of_time("smelt BERT-base"):
        v, why = smelt(a.smelt, ["run", "zoo:bert_base", "--batch", "8", "--dim", "sequence=128", "--backend", "cuda",
                                 "--precision", "mixed-f16", "--json", "--repeat", "50"])
        if v is None:
            print(f"| smelt | mixed-f16 | error: {why} | |", flush=True)
        else:
            print(f"| smelt | mixed-f16 | {v['median_ms']:.3f} | {v['device_bytes'] / 2**20:.1f} |", flush=True)
    try:
        import torch
    except Exception as e:
        print(f"| PyTorch | - | not available: {e} | |")
        return
    if out_of_time("PyTorch BERT-base"):
        return
    try:
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().eval()
        x = torch.randn(8, 128, 768, device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            for _ in range(3):
                model(x)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms = median_ms(torch, lambda: model(x), 30)
        print(f"| PyTorch {torch.__version__} eager nn.TransformerEncoder | autocast float16 | {ms:.3f} | {torch.cuda.max_memory_allocated() / 2**20:.1f} |",
              flush=True)
    except Exception as e:
        print(f"| PyTorch | autocast float16 | failed: {str(e).splitlines()[0][:80]} | |", flush=True)
    torch.cuda.empty_cache()


def torch_inference_row(torch, batch, mode):
    if out_of_time(f"PyTorch {mode} inference at batch {batch}"):
        return
    try:
        ms, peak, weights, prep = bench_torch(torch, batch, mode)
        print(f"| PyTorch {torch.__version__} {mode} | {batch} | {ms:.3f} | {peak / 2**20:.1f} | {weights / 2**20:.1f} | {(peak - weights) / 2**20:.1f} | {prep:.1f} |", flush=True)
    except Exception as e:
        print(f"| PyTorch {mode} | {batch} | failed: {str(e).splitlines()[0][:80]} | | | | |", flush=True)
    torch.cuda.empty_cache()


def training(a):
    import numpy as np
    print("\n## Training: weights after 20 steps against PyTorch's\n")
    print("| model | run | arrays | worst error / tolerance (rtol 1e-4, atol 1e-5) | ms per step |")
    print("|---|---|---|---|---|")
    for model in ["mlp", "cnn"]:
        d = os.path.join(a.train_runs, model)
        for run, opts in TRAIN_RUNS:
            if out_of_time(f"training {model} {run}"):
                continue
            with tempfile.TemporaryDirectory() as ck:
                v, why = smelt(a.smelt, ["train", os.path.join(d, "model.onnx"), "--data", os.path.join(d, "train.npz"), "--batch", "32",
                                         "--steps", "20", "--no-shuffle", "--checkpoint", ck, "--backend", a.train_backend, "--json",
                                         "--tf32", "off", *opts])  # exact f32, as PyTorch's CPU references
                if v is None:
                    print(f"| {model} | {run} | error: {why} | | |", flush=True)
                    continue
                got, want = np.load(os.path.join(ck, "checkpoint.npz")), np.load(os.path.join(d, run + ".npz"))
                worst, n = 0.0, 0
                for k in want.files:
                    if k in got.files:
                        g, w = got[k].astype(np.float64), want[k].astype(np.float64)
                        worst = max(worst, float(np.max(np.abs(g - w) / (1e-5 + 1e-4 * np.abs(w)))))
                        n += 1
                if worst > 1.0 or n < 4:
                    FAILURES.append(f"train {model} {run}: {n} arrays, worst {worst:.2f} x tolerance")
                print(f"| {model} | {run} | {n} | {worst:.3f}{'' if worst <= 1.0 and n >= 4 else ' MISMATCH'} | {v['ms_per_step']:.2f} |", flush=True)
    print("\n## Training: ResNet-50, batch 32, Adam\n")
    print("| engine | ms per step | samples/s | peak device MiB | setup s |")
    print("|---|---|---|---|---|")
    profiles = []
    for p in TRAIN_PRECISIONS:
        log = os.path.join(tempfile.mkdtemp(), "steps.jsonl")
        v, why = (None, "skipped: out of time") if out_of_time(f"smelt ResNet-50 training, {p}") else smelt(
            a.smelt, ["train", *RESNET_TRAIN, "--precision", p, "--data", "synthetic:352", "--steps", "10", "--backend", a.train_backend,
                      "--json", "--log-json", log], timeout=600)
        if v is None:
            print(f"| smelt {p} | error: {why} | | | |", flush=True)
            continue
        # The median step (the first loads and JIT-compiles the kernels).
        steps = sorted(json.loads(line)["ms"] for line in open(log) if '"ms"' in line and "summary" not in line)
        ms = steps[len(steps) // 2] if steps else v["ms_per_step"]
        print(f"| smelt {p} | {ms:.2f} | {32e3 / ms:.0f} | {v['device_bytes'] / 2**20:.1f} | {why} |", flush=True)
        profiles.append(p)
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        torch_train_row(torch, "eager")
        torch_train_row(torch, "eager", torch.bfloat16)
    except Exception as e:
        print(f"| PyTorch | not available: {e} | | | |")
    for p in profiles:
        if a.train_backend == "cuda" and not out_of_time(f"the training step's profile, {p}"):
            profile_step(a, p)


def torch_train_row(torch, mode, autocast=None):
    if autocast is not None:
        mode += f" autocast {str(autocast).removeprefix('torch.')}"
    if out_of_time(f"PyTorch {mode} training"):
        return
    try:
        ms, peak, prep = bench_torch_train(torch, 32, mode, autocast)
        print(f"| PyTorch {torch.__version__} {mode} | {ms:.2f} | {32e3 / ms:.0f} | {peak / 2**20:.1f} | {prep:.1f} |", flush=True)
    except Exception as e:
        print(f"| PyTorch {mode} | failed: {str(e).splitlines()[0][:80]} | | | |", flush=True)
    torch.cuda.empty_cache()


def torch_compiled(a):
    """The torch.compile rows, last: each spends a minute or more compiling."""
    try:
        import torch
        if not torch.cuda.is_available():
            return
    except Exception:
        return
    print("\n## PyTorch torch.compile (ResNet-50)\n")
    print("| engine | batch | median ms | peak device MiB | of which weights MiB | activations and workspace MiB | setup s |")
    print("|---|---|---|---|---|---|---|")
    for batch in speed_batches(a):
        torch_inference_row(torch, batch, "torch.compile")
    if a.train_runs:
        print("\n| engine (training, batch 32, Adam) | ms per step | samples/s | peak device MiB | setup s |")
        print("|---|---|---|---|---|")
        torch_train_row(torch, "torch.compile")


def profile_step(a, precision):
    """One ResNet-50 Adam step (batch 32), each kernel timed by CUDA events."""
    v, why = smelt(a.smelt, ["run", *[o.replace("--optimizer", "--train") for o in RESNET_TRAIN], "--precision", precision, "--backend", "cuda", "--profile", "--json"],
                   timeout=300)
    if v is None:
        print(f"\nThe training step's profile: error: {why}")
        return
    ks = v["kernels"]
    total = sum(k["ms"] for k in ks)
    kinds = {}
    for k in ks:
        kind = k["kernel"].split("_")[0]
        n, ms, fl, by = kinds.get(kind, (0, 0.0, 0, 0))
        kinds[kind] = (n + 1, ms + k["ms"], fl + k["flops"], by + k["bytes"])
    print(f"\n## Training step profile: ResNet-50, batch 32, Adam, {precision} ({len(ks)} kernels, {total:.2f} ms in kernels)\n")
    print("| kernel family | kernels | ms | share | GFLOP/s | GB/s |")
    print("|---|---|---|---|---|---|")
    for kind, (n, ms, fl, by) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"| {kind} | {n} | {ms:.2f} | {100 * ms / total:.1f}% | {fl / (ms * 1e6):.0f} | {by / (ms * 1e6):.0f} |")
    print("\n| slowest kernels | node | ms | GFLOP/s | GB/s |")
    print("|---|---|---|---|---|")
    for k in sorted(ks, key=lambda k: -k["ms"])[:15]:
        print(f"| {k['kernel'][:60]} | {k['node'][:40]} | {k['ms']:.3f} | {k['flops'] / (k['ms'] * 1e6):.0f} | {k['bytes'] / (k['ms'] * 1e6):.0f} |", flush=True)


def bench_torch_train(torch, batch, mode, autocast=None, iters=10):
    """Median ms of an Adam step of ResNet-50 (batch norm frozen, as smelt trains by default) and the peak device memory;
    `autocast`: the forward pass and loss under torch.autocast with that dtype."""
    model = torch_resnet50(torch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    t0 = time.time()
    step_model = torch.compile(model) if mode.startswith("torch.compile") else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            loss = torch.nn.functional.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prep = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    ms = median_ms(torch, step, iters)
    return ms, torch.cuda.max_memory_allocated(), prep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--quick", action="store_true", help="f32 only, ResNet-50 at batch 32 only (about three minutes)")
    ap.add_argument("--list-compiles", action="store_true", help="print MODEL PRECISION BATCH per line for --prepare, then exit")
    ap.add_argument("--train-runs", help="scripts/make_train_runs.py's output: adds the training check")
    ap.add_argument("--train-only", action="store_true", help="only the training check (no probe)")
    ap.add_argument("--train-backend", default="cuda", help=argparse.SUPPRESS)  # cpu: try the check's logic without a GPU
    ap.add_argument("--list-train-compiles", action="store_true", help="print the training check's smelt compile arguments, one run per line")
    ap.add_argument("--budget", type=float, help="seconds: no part starts after them (the slowest parts run last)")
    ap.add_argument("--vision", help="scripts/make_vision.py's output: adds the vision check (torchvision's models)")
    ap.add_argument("--vision-only", action="store_true", help="only the vision check (no probe)")
    ap.add_argument("--vision-backend", default="cuda", help=argparse.SUPPRESS)  # emulator: try the check's logic without a GPU
    ap.add_argument("--list-vision-compiles", action="store_true", help="print the vision check's smelt compile arguments, one run per line")
    a = ap.parse_args()
    global DEADLINE
    if a.budget:
        DEADLINE = time.time() + a.budget
    if a.list_compiles:
        for m, p, b in compiles(a):
            print(m, p, b)
        return
    if a.list_train_compiles:
        for args in train_compiles(a.train_runs):
            print(" ".join(args))
        return
    if a.list_vision_compiles:
        for args in vision_compiles(a.vision):
            print(" ".join(args))
        return
    if a.vision_only or a.train_only:
        (vision if a.vision_only else training)(a)
        exit_on_failures()
        return
    t = time.time()
    # First contact: one run that synchronises after every launch, so a
    # device fault names its kernel.
    try:
        probe = subprocess.run([a.smelt, "run", variant(a, "resnet50"), "--backend", "cuda", "--repeat", "1", "--sync"],
                               capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        sys.exit(f"gpu-check: the probe (ResNet-50, --sync) hung for 180 s: {(e.stderr or b'')[-2000:]!r}")
    if probe.returncode != 0:
        sys.exit(f"gpu-check: smelt cannot use the GPU: {probe.stderr.strip()}")
    print(probe.stdout.strip().splitlines()[0] if probe.stdout.strip() else "", file=sys.stderr)
    if not a.skip_correctness:
        correctness(a)
        if a.vision:
            vision(a)
    speed(a)
    if not a.quick:
        transformer(a)
        tuning(a)
    if a.train_runs:
        training(a)
    torch_compiled(a)
    if SKIPPED:
        print(f"\nSkipped (the --budget of {a.budget:.0f} s was spent): " + "; ".join(SKIPPED))
    print(f"\ngpu-check finished in {time.time() - t:.0f} s", file=sys.stderr)
    exit_on_failures()


def exit_on_failures():
    """Lists the failures and exits 1, if there were any."""
    if FAILURES:
        print(f"gpu-check: {len(FAILURES)} failures:", *FAILURES, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
