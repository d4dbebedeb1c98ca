#!/usr/bin/env python3
"""Export torchvision's vision models as users export them, with
onnxruntime's logits as the reference: the convolution shapes users run
(basic blocks with 1x1 stride-2 downsamples, bottlenecks, grouped and
depthwise convs, squeeze-excitation, hard-swish, channels-last LayerNorm)
and a ViT.

Models (seeded random weights, no download; batch-norm statistics, scales
and biases made random too, so that no layer is an identity): ResNet-18,
ResNet-34, ResNeXt-50 32x4d, RegNetY-400MF, MobileNetV3-Small,
EfficientNet-B0, ConvNeXt-Tiny at full width, on 64x64 images (every
layer, channel count and stride as at 224x224, the planes smaller, so the
emulator runs them in CI); and a ViT of torchvision's VisionTransformer
(64x64 images, patches of 8, 2 layers, width 128, 4 heads). Each is exported
by the TorchScript exporter (dynamo=False, opset 17, the batch a symbolic
dimension "batch"), in eval mode.

Output, per model, under <out>/<model>/:
    model.onnx
    input_b<N>.pb, output_b<N>.pb   batch N = 1 and 2: random images, and
                                    onnxruntime's logits (graph optimizations
                                    off), checked against PyTorch's (1e-4 of
                                    their range) before they are written
and finally <out>/.done.

Usage: make_vision.py [--out DIR]
"""
import argparse
import os
import warnings

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from onnx import numpy_helper

warnings.filterwarnings("ignore")
SIDE = 64


def vit():
    return torchvision.models.VisionTransformer(
        image_size=SIDE, patch_size=8, num_layers=2, num_heads=4, hidden_dim=128, mlp_dim=256
    )


MODELS = {
    "resnet18": torchvision.models.resnet18,
    "resnet34": torchvision.models.resnet34,
    "resnext50_32x4d": torchvision.models.resnext50_32x4d,
    "regnet_y_400mf": torchvision.models.regnet_y_400mf,
    "mobilenet_v3_small": torchvision.models.mobilenet_v3_small,
    "efficientnet_b0": torchvision.models.efficientnet_b0,
    "convnext_tiny": torchvision.models.convnext_tiny,
    "vit": vit,
}


def randomized(model, seed):
    """Every normalization's statistics, scale and bias random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)) or type(m).__name__ == "LayerNorm2d":
                if m.weight is not None:
                    m.weight.copy_(0.8 + 0.4 * torch.rand(m.weight.shape, generator=g))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not p.any():  # ViT's head starts at zero
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            if name.endswith("layer_scale"):
                p.copy_(0.1 + 0.2 * torch.rand(p.shape, generator=g))
    return model.eval()


def write(path, name, array):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(array, name).SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".testdata/vision")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    for i, (name, make) in enumerate(MODELS.items()):
        torch.manual_seed(i)
        model = randomized(make(), 100 + i)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        x = torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(7 + i))
        path = os.path.join(d, "model.onnx")
        torch.onnx.export(
            model, (x,), path, dynamo=False, opset_version=17, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        )
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        for n in (1, 2):
            xs = x[:n].numpy()
            (y,) = sess.run(None, {"x": xs})
            with torch.no_grad():
                want = model(x[:n]).numpy()
            err = np.abs(y - want).max() / np.abs(want).max()
            assert err < 1e-4, f"{name} batch {n}: onnxruntime is {err:.2e} of range from PyTorch"
            write(os.path.join(d, f"input_b{n}.pb"), "x", xs)
            write(os.path.join(d, f"output_b{n}.pb"), "logits", y)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters")
    open(os.path.join(out, ".done"), "w").close()


if __name__ == "__main__":
    main()
