#!/usr/bin/env python3
"""Build random-weight variants of the ONNX backend-test "light" models.

The light models (onnx/backend/test/data/light/light_<name>.onnx) are real
architectures whose weights are all the constant 0.02, produced by
ConstantOfShape nodes, plus a few float initializers. With such weights every
channel computes the same thing, so they are weak tests of a compiler. This
script replaces every float weight with seeded random values scaled for its
role (He init for Conv/Gemm weights, near-identity BatchNormalization, ...),
then calibrates the BatchNormalization statistics and the classifier gain on
the test image (see calibrate()), so activations stay well-conditioned through
the deep nets and the final softmax is neither uniform nor one-hot. It then
runs onnxruntime with all graph optimizations disabled to produce the
reference output.

Output, per model, under <out>/<name>/:
    model.onnx    the variant (same IR version / opset / topology otherwise)
    input_0.pb    TensorProto of the image input, seeded normal [1,3,224,224]
    output_0.pb   TensorProto of the graph output computed by onnxruntime
    logits_0.pb   the logits: the input of a final Softmax (else the output),
                  which checks every class, where most probabilities sit
                  below any useful tolerance
    batch_input.pb, batch_logits.pb, batch_output.pb
                  a batch of two different seeded images, their logits and
                  outputs (onnxruntime runs each image: the models fix batch 1)
and finally <out>/.done once all models succeeded.

Usage: make_variants.py [--data DIR] [--out DIR] [name ...]
"""
import argparse
import os
import sys
import time
import zlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2",
          "resnet50", "shufflenet", "squeezenet", "vgg19", "zfnet512"]

# Ops that merely re-shape a weight; role detection looks through them to the
# real consumer (e.g. a [C] scale -> Unsqueeze(axes=[1,2]) -> Mul).
PASS_THROUGH = {"Unsqueeze", "Identity", "Reshape"}

# Std of the logits (classifier output, before softmax) after calibration;
# ~2.5 gives a clearly peaked but not one-hot softmax over 1000 classes.
LOGIT_STD = 2.5
# Ops between the classifier and the softmax/graph output that commute with a
# positive rescaling (f(c*x) = c*f(x)), so scaling the classifier's weight and
# bias by c scales the logits by exactly c.
HOMOGENEOUS = {"Relu", "GlobalAveragePool", "AveragePool", "Reshape",
               "Flatten", "Dropout", "Identity"}

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_seed(name):
    """Stable per-model seed (crc32 of the name; Python's hash() is salted)."""
    return zlib.crc32(name.encode("utf-8"))


def real_consumer(name, consumers):
    """(node, input slot) of the first non-pass-through consumer of `name`."""
    frontier = [name]
    while frontier:
        tensor = frontier.pop(0)
        for node, slot in consumers.get(tensor, []):
            if node.op_type in PASS_THROUGH and slot == 0:
                frontier.append(node.output[0])
            else:
                return node, slot
    return None, None  # unused tensor


def get_attr(node, attr_name, default):
    for a in node.attribute:
        if a.name == attr_name:
            return helper.get_attribute_value(a)
    return default


def random_weight(rng, shape, node, slot):
    """Random float32 array of `shape`, scaled for its role as input `slot`
    of `node` (None if unused)."""
    op = node.op_type if node is not None else None
    normal = lambda: rng.standard_normal(shape, dtype=np.float32)
    uniform = lambda lo, hi: rng.uniform(lo, hi, shape).astype(np.float32)

    if op == "Conv" and slot == 1:
        # W is [M, C/group, kH, kW]: fan_in = in-channels-per-group * kH * kW.
        fan_in = int(np.prod(shape[1:]))
        return normal() * np.float32(np.sqrt(2.0 / fan_in))
    if op in ("Gemm", "MatMul") and slot == 1:
        # Gemm B is [K, N], or [N, K] with transB=1; MatMul B is [..., K, N].
        # (inception_v1's W is [1, 1, 1000, 1024], Reshape'd to 2-D.)
        trans_b = op == "Gemm" and get_attr(node, "transB", 0)
        fan_in = shape[-1] if trans_b else shape[-2]
        return normal() * np.float32(np.sqrt(2.0 / fan_in))
    if op in ("Conv", "Gemm") and slot == 2:  # biases
        return normal() * np.float32(0.05)
    if op == "BatchNormalization":
        # Inputs: X, scale, B, mean, var. Scale and bias stay as drawn here;
        # mean/var are only initial values, calibrate() replaces them with
        # the real statistics of the BN input.
        if slot == 1:
            return uniform(0.8, 1.2)
        if slot == 4:
            return uniform(0.5, 1.5)
        return normal() * np.float32(0.05)
    if op == "Mul":  # per-channel scale vectors (densenet121, inception_v2)
        return uniform(0.8, 1.2)
    # Add (per-channel shift), unused tensors, anything else: small values.
    return normal() * np.float32(0.05)


def make_variant(model, seed):
    """Randomise all float weights of `model`, in place (no copies: vgg19 is
    ~550 MB once its weights are materialised)."""
    g = model.graph
    rng = np.random.default_rng([seed, 0])
    inits = {t.name: t for t in g.initializer}

    consumers = {}
    for node in g.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))

    def randomise(name, shape):
        node, slot = real_consumer(name, consumers)
        arr = random_weight(rng, tuple(int(d) for d in shape), node, slot)
        return numpy_helper.from_array(arr, name)

    # 1. Float initializers: replace in place (same name, shape, position).
    #    Integer tensors (ConstantOfShape shapes, Reshape targets) are kept.
    #    Names already listed in graph.input keep their (unchanged) entry.
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(randomise(t.name, t.dims))

    # 2. Float ConstantOfShape nodes with a constant shape become initializers.
    #    These models are IR version 3, where every initializer must also be
    #    a graph input (as in the originals), so list the new ones there too.
    replaced = []  # (node index, shape tensor name), in graph order
    for i, node in enumerate(g.node):
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            value = get_attr(node, "value", None)  # default: float 0
            if value is None or value.data_type == TensorProto.FLOAT:
                shape = numpy_helper.to_array(inits[node.input[0]])
                t = randomise(node.output[0], shape)
                g.initializer.append(t)
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
                replaced.append((i, node.input[0]))
    for i, _ in reversed(replaced):
        del g.node[i]

    # 3. The int64 shape tensors of the removed nodes are now dead: drop them
    #    (ORT would warn about each one). Other integer tensors are untouched.
    used = {name for node in g.node for name in node.input}
    dead = {name for _, name in replaced} - used
    for field in (g.initializer, g.input):
        for i in reversed(range(len(field))):
            if field[i].name in dead:
                del field[i]
    return model


def session(model_or_path):
    opts = ort.SessionOptions()
    # No graph rewriting: keep the reference as close to plain ONNX semantics
    # as possible (no fusions, no constant folding).
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3  # e.g. unused-initializer warnings
    if isinstance(model_or_path, onnx.ModelProto):
        model_or_path = model_or_path.SerializeToString()
    return ort.InferenceSession(model_or_path, opts,
                                providers=["CPUExecutionProvider"])


def calibrate(model, feeds):
    """Data-dependent fix-ups on the test input, in place.

    1. BatchNormalization mean/var are set to the actual per-channel mean and
       variance of the BN input (as a trained net's running statistics would
       be), so BN really normalises. With random mean/var BN is just a random
       affine map, and then every residual Sum doubles the activation variance:
       resnet50 reached logits ~1e4, shufflenet ~1e5, i.e. a one-hot softmax.
       The statistics of a BN depend on the BNs upstream, so BNs are
       calibrated level by level (level = number of BNs on the longest path
       from the input), one forward pass per level.
    2. The last Gemm/Conv (the classifier) has its weight and bias scaled so
       the logits have std LOGIT_STD; without this the softmax is near one-hot
       for e.g. inception_v1/v2 (logit std 6-14) and fairly flat for zfnet512.
    Returns the classifier gain applied.
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    level, bns = {}, []
    for node in g.node:  # ONNX nodes are topologically sorted
        lv = max([level.get(i, 0) for i in node.input] + [0])
        if node.op_type == "BatchNormalization":
            lv += 1
            bns.append((lv, node))
        for o in node.output:
            level[o] = lv

    classifier = [n for n in g.node if n.op_type in ("Gemm", "Conv", "MatMul")][-1]
    tail = g.node[list(g.node).index(classifier) + 1:]
    logits = g.output[0].name
    if tail and tail[-1].op_type == "Softmax":
        logits, tail = tail[-1].input[0], tail[:-1]
    assert all(n.op_type in HOMOGENEOUS for n in tail), [n.op_type for n in tail]

    # Calibration session on a temporarily modified graph (copying the whole
    # model is slow for vgg19): BN mean/var become plain graph inputs (they
    # stay listed in graph.input) so one session can be fed updated values,
    # and the BN inputs and the logits become extra outputs.
    stat_names = {n for _, bn in bns for n in bn.input[3:5]}
    stats = {n: numpy_helper.to_array(inits[n]) for n in stat_names}
    n_out = len(g.output)
    for i in reversed(range(len(g.initializer))):
        if g.initializer[i].name in stat_names:
            del g.initializer[i]
    watched = sorted({bn.input[0] for _, bn in bns}) + [logits]
    g.output.extend(onnx.ValueInfoProto(name=n) for n in watched)
    sess = session(model)
    del g.output[n_out:]

    for lv in range(1, max([lv for lv, _ in bns] + [0]) + 1):
        todo = [bn for l, bn in bns if l == lv]
        xs = sess.run([bn.input[0] for bn in todo], {**feeds, **stats})
        for bn, x in zip(todo, xs):
            axes = tuple(a for a in range(x.ndim) if a != 1)
            stats[bn.input[3]] = x.mean(axis=axes, dtype=np.float64).astype(np.float32)
            stats[bn.input[4]] = x.var(axis=axes, dtype=np.float64).astype(np.float32)
    # Put the (calibrated) statistics back as initializers.
    g.initializer.extend(numpy_helper.from_array(arr, name)
                         for name, arr in sorted(stats.items()))

    (z,) = sess.run([logits], {**feeds, **stats})
    gain = LOGIT_STD / float(z.std())
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    for name in classifier.input[1:3]:
        while name in producer and producer[name].op_type in PASS_THROUGH:
            name = producer[name].input[0]  # e.g. inception_v1's Reshape'd W
        arr = numpy_helper.to_array(inits[name]) * np.float32(gain)
        inits[name].CopyFrom(numpy_helper.from_array(arr, name))
    return gain


def process(name, data_dir, out_dir):
    t0 = time.time()
    model = onnx.load(os.path.join(data_dir, "light", f"light_{name}.onnx"))
    seed = model_seed(name)
    variant = make_variant(model, seed)
    g = variant.graph
    final_op = g.node[-1].op_type

    # The runtime input is the single graph input without an initializer.
    init_names = {t.name for t in g.initializer}
    (inp,) = [i for i in g.input if i.name not in init_names]
    (out,) = g.output
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    image = np.random.default_rng([seed, 1]).standard_normal(shape, dtype=np.float32)
    gain = calibrate(variant, {inp.name: image})

    mdir = os.path.join(out_dir, name)
    os.makedirs(mdir, exist_ok=True)
    mpath = os.path.join(mdir, "model.onnx")
    onnx.save(variant, mpath)
    onnx.checker.check_model(mpath)
    (result,) = session(mpath).run(None, {inp.name: image})

    if not np.isfinite(result).all():
        sys.exit(f"error: {name}: output contains NaN/inf")
    # The logits: the final Softmax's input made a second output.
    logits_name = g.node[-1].input[0] if final_op == "Softmax" else out.name
    with_logits = onnx.ModelProto()
    with_logits.CopyFrom(variant)
    if final_op == "Softmax":
        with_logits.graph.output.append(onnx.helper.make_tensor_value_info(logits_name, onnx.TensorProto.FLOAT, None))
    logits_session = session(with_logits.SerializeToString())
    logits = logits_session.run(None, {inp.name: image})[-1]
    second = np.random.default_rng([seed, 2]).standard_normal(shape, dtype=np.float32)
    batch = np.concatenate([image, second])
    both = logits_session.run(None, {inp.name: second})
    batch_logits = np.concatenate([logits, both[-1]])
    batch_output = np.concatenate([result, both[0]])
    for file, array, tensor_name in [("logits_0.pb", logits, logits_name), ("batch_input.pb", batch, inp.name),
                                     ("batch_logits.pb", batch_logits, logits_name),
                                     ("batch_output.pb", batch_output, out.name)]:
        with open(os.path.join(mdir, file), "wb") as f:
            f.write(numpy_helper.from_array(array, tensor_name).SerializeToString())
    with open(os.path.join(mdir, "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(image, inp.name).SerializeToString())
    with open(os.path.join(mdir, "output_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(result, out.name).SerializeToString())

    # Conditioning check on softmax outputs: a near-uniform distribution
    # (max ~ 1/1000) or a one-hot would make a weak numerical test.
    # (densenet121 ends in a 1x1 Conv, i.e. its output is raw logits.)
    if final_op == "Softmax" and not 0.005 < result.max() < 0.99:
        print(f"warning: {name}: poorly conditioned softmax, max={result.max():.4g}",
              file=sys.stderr)
    print(f"{name:13s} shape={list(result.shape)} min={result.min():.4g} "
          f"max={result.max():.4g} argmax={int(result.argmax())} "
          f"(classifier gain {gain:.3g}) {time.time() - t0:.1f}s", flush=True)


def op_cases(out_dir):
    """Single-op models whose outputs onnxruntime computes: the oracle for
    ops that no light model has (<out>/op_<name>/, as the variants)."""
    from onnx import TensorProto, helper
    cases = {
        "gelu": ("Gelu", {}, 20),
        "gelu_tanh": ("Gelu", {"approximate": "tanh"}, 20),
    }
    for name, (op, attrs, opset) in cases.items():
        shape = [2, 3, 8, 8]
        node = helper.make_node(op, ["x"], ["y"], name=name, **attrs)
        graph = helper.make_graph([node], name,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 9
        onnx.checker.check_model(model)
        x = 3.0 * np.random.default_rng([7, len(name)]).standard_normal(shape, dtype=np.float32)
        (y,) = session(model).run(None, {"x": x})
        mdir = os.path.join(out_dir, f"op_{name}")
        os.makedirs(mdir, exist_ok=True)
        onnx.save(model, os.path.join(mdir, "model.onnx"))
        with open(os.path.join(mdir, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, "x").SerializeToString())
        with open(os.path.join(mdir, "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y, "y").SerializeToString())
        print(f"op_{name:9s} {op} {attrs} opset {opset}: onnxruntime output recorded", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO_ROOT, ".testdata", "onnx-data"),
                    help="onnx backend test data dir (containing light/)")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, ".testdata", "variants"))
    ap.add_argument("names", nargs="*", default=MODELS)
    args = ap.parse_args()

    stamp = os.path.join(args.out, ".done")
    if os.path.exists(stamp):
        os.remove(stamp)  # a partial run must not look complete
    for name in args.names:
        process(name, args.data, args.out)
    op_cases(args.out)
    if args.names == MODELS:
        open(stamp, "w").close()


if __name__ == "__main__":
    main()
