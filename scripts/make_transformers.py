#!/usr/bin/env python3
"""Export small random-init transformers as users export them, with
onnxruntime's outputs as the reference.

Models (seeded random weights, no download): PyTorch's nn.TransformerEncoder
and nn.TransformerDecoder (causal, with cross-attention; exported with
static shapes), and Hugging Face BERT (with a padding attention mask), GPT-2 (causal, with a
padding mask) and ViT, built from configs. Each is exported twice, as a user
of torch.onnx.export would: by the TorchScript exporter (dynamo=False,
opset 17, batch and sequence as symbolic dimensions named "batch" and
"sequence") and by the dynamo exporter (dynamo=True, opset 18, static
shapes, weights in an external `model.onnx.data` file). BERT and GPT-2 are
also exported as Hugging Face optimum does (case prefix `opset14_`):
TorchScript exporter, opset 14 (so LayerNorm arrives as ReduceMean, Sub,
Pow, Sqrt, Div, Mul, Add), dimensions named "batch_size" and
"sequence_length", BERT with token_type_ids.

Output, per case, under <out>/<exporter>_<model>/:
    model.onnx (+ model.onnx.data)
    input_<i>.pb, output_0.pb     the exported shapes: batch 2, sequence 16
    dim_input_<i>.pb, dim_output_0.pb
                                  TorchScript exports but the encoder's and decoder's
                                  (they trace their sequence lengths): batch 3,
                                  sequence 8 (for --batch 3 --dim sequence=8)
    args.txt                      the smelt arguments for the dim_ files
    b1_input_<i>.pb, b1_output_0.pb
                                  TorchScript BERT, GPT-2 and ViT: batch 1,
                                  sequence 16
<out>/plan_bert/model.onnx, a larger BERT for planning only, and finally
<out>/.done. onnxruntime runs with graph optimizations off; its
outputs are checked against PyTorch's (atol 1e-4) before they are written.

Usage: make_transformers.py [--out DIR]
"""
import argparse
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

warnings.filterwarnings("ignore")
H, HEADS, LAYERS, FF, VOCAB = 64, 4, 2, 128, 1000


class LastHidden(torch.nn.Module):
    """A Hugging Face text model called with keywords, returning one tensor."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class TokenTypes(torch.nn.Module):
    """BERT called as optimum exports it: ids, mask and token types."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


class CausalDecoder(torch.nn.Module):
    """nn.TransformerDecoder with a causal target mask and cross-attention."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, tgt, memory):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.m(tgt, memory, tgt_mask=mask, tgt_is_causal=True)


class Pixels(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values):
        return self.m(pixel_values=pixel_values).last_hidden_state


def text_inputs(batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - seq // 3:] = 0  # the last sequence is padded
    return (ids, mask)


def typed_inputs(batch, seq, seed):
    ids, mask = text_inputs(batch, seq, seed)
    types = torch.randint(0, 2, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))
    return (ids, mask, types)


def models():
    import transformers as tf

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(H, HEADS, FF, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
    yield "tenc", enc, ["x"], {"x": {0: "batch", 1: "sequence"}}, lambda b, s, seed: (
        torch.randn(b, s, H, generator=torch.Generator().manual_seed(seed)),)
    torch.manual_seed(5)
    layer = torch.nn.TransformerDecoderLayer(H, HEADS, FF, dropout=0.0, batch_first=True)
    dec = torch.nn.TransformerDecoder(layer, LAYERS)
    yield "tdec", CausalDecoder(dec), ["tgt", "memory"], None, lambda b, s, seed: (
        torch.randn(b, s, H, generator=torch.Generator().manual_seed(seed)),
        torch.randn(b, 12, H, generator=torch.Generator().manual_seed(seed + 1)))
    names = ["input_ids", "attention_mask"]
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    torch.manual_seed(1)
    bert = tf.BertModel(tf.BertConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                      intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=64))
    yield "bert", LastHidden(bert), names, axes, text_inputs
    torch.manual_seed(2)
    gpt2 = tf.GPT2Model(tf.GPT2Config(n_embd=H, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))
    yield "gpt2", LastHidden(gpt2), names, axes, text_inputs
    torch.manual_seed(3)
    vit = tf.ViTModel(tf.ViTConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   intermediate_size=FF, image_size=32, patch_size=8), add_pooling_layer=False)
    yield "vit", Pixels(vit), ["pixel_values"], {"pixel_values": {0: "batch"}}, lambda b, s, seed: (
        torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def save(path, array, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.ascontiguousarray(array), name).SerializeToString())


def reference(model_path, module, names, inputs, prefix, out_dir):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = module(*inputs).numpy()
    err = float(np.abs(got - want).max())
    if err > 1e-4:
        raise SystemExit(f"{model_path}: onnxruntime and PyTorch differ by {err}")
    for i, (n, t) in enumerate(zip(names, inputs)):
        save(os.path.join(out_dir, f"{prefix}input_{i}.pb"), t.numpy(), n)
    save(os.path.join(out_dir, f"{prefix}output_0.pb"), got, sess.get_outputs()[0].name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", ".testdata", "transformers"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, module, names, axes, make_inputs in models():
        module.eval()
        inputs = make_inputs(2, 16, 10)
        for exporter in ["torchscript", "dynamo"]:
            d = os.path.join(args.out, f"{exporter}_{name}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "model.onnx")
            if exporter == "torchscript":
                torch.onnx.export(module, inputs, path, dynamo=False, opset_version=17, input_names=names,
                                  output_names=["y"], dynamic_axes=axes)
            else:
                torch.onnx.export(module, inputs, path, dynamo=True, opset_version=18, input_names=names,
                                  output_names=["y"], external_data=True, verbose=False)
            onnx.checker.check_model(path)
            reference(path, module, names, inputs, "", d)
            # The TorchScript export of nn.TransformerEncoder traces its
            # sequence length into Reshape targets: onnxruntime cannot run it
            # at another length either.
            if exporter == "torchscript" and name not in ("tenc", "tdec"):
                seq = 8 if name != "vit" else 16
                reference(path, module, names, make_inputs(3, seq, 11), "dim_", d)
                reference(path, module, names, make_inputs(1, 16, 12), "b1_", d)
                dims = "" if name == "vit" else " --dim sequence=8"
                with open(os.path.join(d, "args.txt"), "w") as f:
                    f.write(f"--batch 3{dims}\n")
            print(f"make_transformers: {exporter}_{name}", flush=True)
        if name in ("bert", "gpt2"):
            # As optimum exports them (its default opset for both is 14).
            if name == "bert":
                module, names, make_inputs = TokenTypes(module.m).eval(), names + ["token_type_ids"], typed_inputs
            d = os.path.join(args.out, f"opset14_{name}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "model.onnx")
            torch.onnx.export(module, make_inputs(2, 16, 10), path, dynamo=False, opset_version=14, input_names=names,
                              output_names=["last_hidden_state"],
                              dynamic_axes={n: {0: "batch_size", 1: "sequence_length"} for n in names})
            onnx.checker.check_model(path)
            reference(path, module, names, make_inputs(2, 16, 10), "", d)
            reference(path, module, names, make_inputs(3, 8, 11), "dim_", d)
            with open(os.path.join(d, "args.txt"), "w") as f:
                f.write("--batch 3 --dim sequence_length=8\n")
            print(f"make_transformers: opset14_{name}", flush=True)
    # For planning only (no reference outputs): the memory target, a
    # Hugging Face BERT with hidden 256, 4 heads, 4 layers, intermediate
    # 1024, planned at batch 8 and sequence 512 (`--batch 8 --dim sequence=512`).
    import transformers as tf
    torch.manual_seed(4)
    bert = tf.BertModel(tf.BertConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=4, intermediate_size=1024))
    d = os.path.join(args.out, "plan_bert")
    os.makedirs(d, exist_ok=True)
    names = ["input_ids", "attention_mask"]
    torch.onnx.export(LastHidden(bert).eval(), text_inputs(2, 16, 12), os.path.join(d, "model.onnx"), dynamo=False,
                      opset_version=17, input_names=names, output_names=["y"],
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names})
    print("make_transformers: plan_bert", flush=True)
    open(os.path.join(args.out, ".done"), "w").close()


if __name__ == "__main__":
    main()
