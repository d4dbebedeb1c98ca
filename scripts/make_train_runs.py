#!/usr/bin/env python3
"""Data and PyTorch references for `smelt train` (tests/train_cmd.rs).

Two seeded models exported from PyTorch (batch dimension symbolic), a
synthetic separable classification task for each, and the weights PyTorch
reaches after STEPS optimizer steps on the data in file order (no shuffle),
a last partial batch dropped each epoch, as `smelt train --no-shuffle` does.

Output, per model (mlp, cnn), under <out>/<model>/:
    model.onnx          TorchScript exporter, opset 17, initial weights
    train.npz, val.npz  x (float32) and y (int64 class indices)
    <run>.npz           the state dict after STEPS steps, keys as the
                        ONNX initializers; runs: sgd, adam, sgd_acc4
                        (batch 32 as 4 micro-batches of 8)
    meta.txt            key=value lines: classes, batch, steps
then <out>/.done.

Usage: make_train_runs.py [--out DIR]
"""
import argparse
import os

import numpy as np
import torch

BATCH, STEPS, CLASSES = 32, 20, 4
RUNS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), 1),
    "adam": (lambda p: torch.optim.Adam(p, lr=1e-2), 1),
    "sgd_acc4": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), 4),
}


def mlp_data(rng, n):
    """Points in R^10 labelled by the arg-max of a fixed linear map: linearly separable."""
    w = np.random.default_rng(1).standard_normal((10, CLASSES)).astype(np.float32)
    x = rng.standard_normal((n, 10)).astype(np.float32)
    return x, (x @ w).argmax(1).astype(np.int64)


def cnn_data(rng, n):
    """8x8 images of noise with a bright 3x3 square in the quadrant the label names."""
    x = 0.3 * rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, CLASSES, n).astype(np.int64)
    for i, c in enumerate(y):
        r, col = 4 * (c // 2) + rng.integers(0, 2), 4 * (c % 2) + rng.integers(0, 2)
        x[i, 0, r:r + 3, col:col + 3] += 1.5
    return x, y


def models():
    nn = torch.nn
    yield "mlp", nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, CLASSES)), mlp_data
    yield "cnn", nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES),
    ), cnn_data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".testdata/train_runs")
    out = ap.parse_args().out
    for name, model, make in models():
        torch.manual_seed(0)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
        model = model.eval()  # batch norm frozen, as smelt train's default
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(0)
        x, y = make(rng, 520)  # 16 batches of 32, 8 samples dropped per epoch
        xv, yv = make(rng, 200)
        np.savez(os.path.join(d, "train.npz"), x=x, y=y)
        np.savez(os.path.join(d, "val.npz"), x=xv, y=yv)
        torch.onnx.export(model, (torch.from_numpy(x[:BATCH]),), os.path.join(d, "model.onnx"), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, do_constant_folding=False)
        init = {k: v.clone() for k, v in model.state_dict().items()}
        per_epoch = len(x) // BATCH
        for run, (make_opt, k) in RUNS.items():
            model.load_state_dict(init)
            opt = make_opt(model.parameters())
            for s in range(STEPS):
                pos = s % per_epoch
                xb = torch.from_numpy(x[pos * BATCH:(pos + 1) * BATCH])
                yb = torch.from_numpy(y[pos * BATCH:(pos + 1) * BATCH])
                opt.zero_grad()
                for xm, ym in zip(xb.chunk(k), yb.chunk(k)):
                    (torch.nn.functional.cross_entropy(model(xm), ym) / k).backward()
                opt.step()
            np.savez(os.path.join(d, run + ".npz"), **{k: v.detach().numpy() for k, v in model.state_dict().items()
                                                      if "num_batches" not in k})
        with open(os.path.join(d, "meta.txt"), "w") as f:
            f.write(f"classes={CLASSES}\nbatch={BATCH}\nsteps={STEPS}\n")
    open(os.path.join(out, ".done"), "w").close()


if __name__ == "__main__":
    main()
