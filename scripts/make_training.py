#!/usr/bin/env python3
"""Training cases with PyTorch as the oracle: small seeded models exported
to ONNX (eval mode: batch norm frozen), and the weights PyTorch reaches after
three steps of SGD with momentum and three of Adam, from the exported
weights, on one fixed batch.

Output, per case, under <out>/<case>/:
    model.onnx               TorchScript exporter, opset 17, initial weights
    input_0.pb, labels.pb    the batch (labels int64 [N], or [B, S] for the
                             token models `lm` and `lm_causal`; targets for MSE)
    <opt>/<param>.pb         each parameter PyTorch trains, after 3 steps
                             (opt: sgd, adam...)
    <opt>/losses.pb          the loss before each step
    <opt>/running/<buffer>.pb  with batch norm in training mode (case
                             `bn_train`): the running statistics after 3 steps
    trainable.txt            the parameters PyTorch trains, one a line
    meta.txt                 loss (ce, mse, tokens: per-token cross-entropy,
                             causal-lm), batch norm mode, one `key=value` a line
then <out>/.done.

Usage: make_training.py [--out DIR]
"""
import argparse
import math
import os

import numpy as np
import torch
from onnx import numpy_helper

torch.manual_seed(0)
STEPS = 3
OPTS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    # Gradients clipped by their global norm (CLIP) before the update.
    "sgd_clip": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    # Hugging Face's cosine schedule with warmup (WARMUP, then to 0 at step STEPS).
    "adamw_cosine": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
}
CLIP, WARMUP = 0.5, 1


def cosine_with_warmup(step):
    """get_cosine_schedule_with_warmup's factor (num_cycles 0.5)."""
    if step < WARMUP:
        return step / max(1, WARMUP)
    progress = (step - WARMUP) / max(1, STEPS - WARMUP)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


class Block(torch.nn.Module):
    """A ResNet basic block (batch norm frozen in eval mode)."""

    def __init__(self, c, stride):
        super().__init__()
        out = c * stride
        self.c1 = torch.nn.Conv2d(c, out, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(out)
        self.c2 = torch.nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(out)
        self.down = None
        if stride != 1:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(c, out, 1, stride, bias=False), torch.nn.BatchNorm2d(out))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class Encoder(torch.nn.Module):
    """nn.TransformerEncoder (2 layers, post-norm, ReLU), mean-pooled, a linear head."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 4)
        # Distinct values everywhere: the layers start as copies, and the
        # exporter would share identical initializers between them.
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        return self.head(self.enc(x).mean(dim=1))


class TinyLM(torch.nn.Module):
    """Token ids [B, S] to logits [B, S, V]: an embedding, a causal mix of
    each position with the one before it, a GELU layer, a layer norm and a
    head. The embedding table is frozen (requires_grad off) unless
    `train_embedding`: smelt's default rule trains it (a parameter's name),
    PyTorch's list of parameters (--trainable) says when not to."""

    VOCAB = 11

    def __init__(self, train_embedding=False):
        super().__init__()
        self.emb = torch.nn.Embedding(self.VOCAB, 16)
        self.emb.weight.requires_grad_(train_embedding)
        self.prev = torch.nn.Linear(16, 16, bias=False)
        self.l1 = torch.nn.Linear(16, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.head = torch.nn.Linear(24, self.VOCAB)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(24))
            self.norm.bias.add_(0.1 * torch.randn(24))

    def forward(self, ids):
        e = self.emb(ids)
        before = torch.nn.functional.pad(e[:, :-1], (0, 0, 1, 0))
        h = torch.nn.functional.gelu(self.l1(e + self.prev(before)))
        return self.head(self.norm(h))


def token_loss(z, y, causal):
    """PyTorch's per-token cross-entropy (ignore_index -100), shifted by one
    for a causal language model as Hugging Face's *ForCausalLM heads do."""
    if causal:
        z, y = z[:, :-1], y[:, 1:]
    return torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))


def randomize_bn(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m


def cases():
    nn = torch.nn
    yield "mlp", nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 5)), (8, 20), "ce"
    yield "mlp_mse", nn.Sequential(nn.Linear(12, 24), nn.Sigmoid(), nn.Linear(24, 24), nn.GELU(), nn.Linear(24, 3)), (6, 12), "mse"
    yield "cnn", nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=2, dilation=2, groups=2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AvgPool2d(2), nn.Conv2d(16, 16, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10), nn.Softmax(dim=1),
    ), (4, 3, 16, 16), "ce"
    yield "resnet_blocks", nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        Block(8, 1), Block(8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 7),
    ), (4, 3, 12, 12), "ce"
    yield "tenc", Encoder(), (3, 5, 16), "ce"
    # Per-token cross-entropy: logits [B, S, V], labels [B, S] with some at
    # -100 (ignored); and a causal LM's loss, the labels the input ids.
    yield "lm", TinyLM(), (3, 7), "tokens"
    yield "lm_causal", TinyLM(), (3, 7), "causal-lm"
    # Every parameter trained, the embedding too, by smelt's default rule
    # (the others take PyTorch's list, trainable.txt).
    yield "lm_emb", TinyLM(train_embedding=True), (3, 7), "tokens"
    # A fresh batch norm (zero running means and biases, unit variances and
    # scales): the exporter writes its running statistics as Identities of
    # its bias and scale, which PyTorch trains while the statistics stay.
    yield "bn_fresh", nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    ), (4, 3, 8, 8), "ce"
    # Batch norm in training mode: batch statistics, running statistics
    # updated. (No conv bias before it: the batch mean cancels it, so its
    # gradient is rounding noise that Adam would amplify into a full step.)
    yield "bn_train", nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 12, 3, padding=1, bias=False), nn.BatchNorm2d(12), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 5),
    ), (6, 3, 10, 10), "ce"


def save(t, path, name):
    p = numpy_helper.from_array(np.ascontiguousarray(t), name)
    with open(path, "wb") as f:
        f.write(p.SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".testdata/training")
    out = ap.parse_args().out
    for name, model, shape, loss in cases():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model = (model if name == "bn_fresh" else randomize_bn(model)).eval()
        bn_train = name == "bn_train"
        tokens = isinstance(model, TinyLM)
        x = torch.randint(0, TinyLM.VOCAB, shape) if tokens else torch.randn(*shape)
        if tokens:
            # The last two positions of the first sequence are padding.
            y = x.clone() if loss == "causal-lm" else torch.randint(0, TinyLM.VOCAB, shape)
            y[0, -2:] = -100
        elif loss == "ce":
            classes = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not isinstance(m, torch.nn.modules.linear.NonDynamicallyQuantizableLinear)][-1].out_features
            y = torch.randint(0, classes, (shape[0],))
        else:
            y = torch.randn(shape[0], [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1].out_features)
        torch.onnx.export(model, (x,), os.path.join(d, "model.onnx"), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], do_constant_folding=False)
        save(x.numpy(), os.path.join(d, "input_0.pb"), "x")
        save(y.numpy(), os.path.join(d, "labels.pb"), "labels")
        init = {k: v.clone() for k, v in model.state_dict().items()}
        if bn_train:
            model.train()
        with open(os.path.join(d, "trainable.txt"), "w") as f:
            f.write("".join(n + "\n" for n, p in model.named_parameters() if p.requires_grad))
        with open(os.path.join(d, "meta.txt"), "w") as f:
            f.write(f"loss={loss}\nsteps={STEPS}\nbatch_norm={'train' if bn_train else 'frozen'}\n")
        for opt_name, make in OPTS.items():
            model.load_state_dict(init)
            opt = make(model.parameters())
            sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup) if opt_name.endswith("cosine") else None
            losses = []
            for _ in range(STEPS):
                opt.zero_grad()
                z = model(x)
                if tokens:
                    l = token_loss(z, y, loss == "causal-lm")
                elif loss == "ce":
                    if isinstance(model, torch.nn.Sequential) and isinstance(model[-1], torch.nn.Softmax):
                        z = model[:-1](x)
                    l = torch.nn.functional.cross_entropy(z, y)
                else:
                    l = torch.nn.functional.mse_loss(z, y)
                losses.append(l.item())
                l.backward()
                if opt_name.endswith("clip"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                opt.step()
                if sched is not None:
                    sched.step()
            od = os.path.join(d, opt_name)
            os.makedirs(od, exist_ok=True)
            for k, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                save(p.detach().numpy(), os.path.join(od, k + ".pb"), k)
            save(np.array(losses, dtype=np.float32), os.path.join(od, "losses.pb"), "losses")
            if bn_train:
                os.makedirs(os.path.join(od, "running"), exist_ok=True)
                for k, b in model.named_buffers():
                    if "running" in k:
                        save(b.detach().numpy(), os.path.join(od, "running", k + ".pb"), k)
    open(os.path.join(out, ".done"), "w").close()


if __name__ == "__main__":
    main()
