"""Tests of smelt's Python package (run by scripts/test.sh after the Rust
tests, against the package installed into .venv).

The CLI (``$SMELT_BIN``, default ``target/debug/smelt``) is the reference
for plans; onnxruntime and PyTorch for outputs.
"""

import doctest
import json
import os
import pathlib
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import smelt

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("SMELT_TESTDATA", ROOT / ".testdata"))
SQUEEZENET = DATA / "variants" / "squeezenet" / "model.onnx"


def cli(*args):
    """The CLI's --json for args."""
    exe = os.environ.get("SMELT_BIN", str(ROOT / "target" / "debug" / "smelt"))
    assert os.path.exists(exe), f"no smelt binary at {exe}: build it (cargo build) or set SMELT_BIN"
    r = subprocess.run([exe, *map(str, args), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def onnxruntime_outputs(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


# ---------------------------------------------------------------- loading


def test_load_from_path_bytes_and_model_proto_agree():
    by_path = smelt.load(SQUEEZENET)
    by_bytes = smelt.load(SQUEEZENET.read_bytes())
    by_proto = smelt.load(onnx.load(str(SQUEEZENET)))
    plans = [m.plan(batch=2).to_dict()["plan"] for m in (by_path, by_bytes, by_proto)]
    assert plans[0] == plans[1] == plans[2]
    assert by_bytes.inputs == by_path.inputs and by_proto.outputs == by_path.outputs
    assert "ONNX bytes" in by_bytes.name and by_path.name == str(SQUEEZENET)


def test_plan_equals_the_cli(tmp_path):
    m = smelt.load(SQUEEZENET, batch=4)
    for kw, flags in [({}, []), ({"precision": "mixed-f16"}, ["--precision", "mixed-f16"]),
                      ({"train": "adam", "accumulate": 2}, ["--train", "adam", "--accumulate", "2"])]:
        p = m.plan(**kw).to_dict()
        c = cli("plan", SQUEEZENET, "--batch", 4, *flags)
        for key in ("plan", "without_fusion", "training", "recomputation"):
            assert p[key] == c[key], (kw, key)
        assert p["model"] == c["model"] == str(SQUEEZENET)


def test_split_plans_equal_the_cli():
    m = smelt.load(SQUEEZENET, batch=2)
    whole = m.plan()
    assert whole.split is None
    for kw, flags in [({"min_memory": True}, ["--min-memory"]), ({"memory_limit": whole.arena_bytes * 3 // 4}, ["--memory-limit", f"{whole.arena_bytes * 3 // 4}B"])]:
        p = m.plan(**kw)
        c = cli("plan", SQUEEZENET, "--batch", 2, *flags)
        assert p.to_dict()["plan"] == c["plan"] and p.split == c["split"], kw
        assert p.arena_bytes == p.split["arena_after"] < p.split["arena_before"] == whole.arena_bytes
        assert "row bands" in p.svg() or "samples" in p.svg()


def test_plan_object():
    p = smelt.load("zoo:mobilenet_v2").plan(batch=8)
    assert p.lower_bound_bytes <= p.arena_bytes < p.naive_activation_bytes
    assert p.breakdown == {"weights": p.weights_bytes, "activations": p.arena_bytes}
    assert p.checked and p.peak.live and p.peak.node
    assert p.svg().startswith("<svg") and p.svg().rstrip().endswith("</svg>")
    html = p._repr_html_()
    assert "<table" in html and "<svg" in html and "arena" in html
    step = smelt.load("zoo:mobilenet_v2", batch=8).plan(train="sgd", momentum=0.9)
    b = step.breakdown
    # One momentum buffer per parameter; none with SGD's default (momentum
    # 0, as torch.optim.SGD).
    assert b["activations"] == step.arena_bytes and b["optimizer_state"] == b["parameters"] > 0
    plain = smelt.load("zoo:mobilenet_v2", batch=8).plan(train="sgd")
    assert plain.breakdown["optimizer_state"] == 0 and plain.breakdown["parameters"] == b["parameters"]
    assert step.total_bytes == step.training["total_bytes"]
    assert b["saved_activations"] + b["gradients"] + b["temporaries"] + b["batch"] + b["recomputed"] <= step.arena_bytes


def test_inspect_and_text():
    m = smelt.load(SQUEEZENET)
    i = m.inspect()
    c = cli("inspect", SQUEEZENET)
    assert i.ops == c["ops"] and i.kernels == c["kernels"] and i.op_histogram == c["op_histogram"]
    assert i.inputs == c["inputs"] == m.inputs
    assert "<table" in i._repr_html_()
    assert "conv" in m.text().lower()


# ---------------------------------------------------------------- from_torch


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(torch.nn.Module):
    """torchvision's resnet18, spelled out (torchvision is not a dependency)."""

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(64)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(512, classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def seeded_resnet18():
    torch.manual_seed(0)
    net = ResNet18()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # statistics that are not the identity
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    return net.eval()


def test_from_torch_resnet18_plans_as_the_cli_and_runs_as_onnxruntime(tmp_path):
    net = seeded_resnet18()
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    m = smelt.from_torch(net, x)
    assert m.batch == 2 and m.inputs[0]["name"] == "x" and m.inputs[0]["shape"] == [2, 3, 96, 96]
    path = tmp_path / "resnet18.onnx"
    m.save(path)
    for batch in (2, 8):
        assert m.plan(batch=batch).to_dict()["plan"] == cli("plan", path, "--batch", batch)["plan"]
    assert m.plan(batch=4, train="adam").to_dict()["training"] == cli("plan", path, "--batch", 4, "--train", "adam")["training"]
    # The dynamic batch: three samples compile the model at batch 3.
    x3 = np.random.default_rng(2).standard_normal((3, 3, 96, 96)).astype(np.float32)
    got = m.run(x3)["output"]
    want = onnxruntime_outputs(path, {"x": x3})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(got, net(torch.from_numpy(x3)).numpy(), rtol=1e-4, atol=1e-4)
    assert np.abs(got).max() > 1e-3  # not a constant model
    # Another dtype of the same kind is converted; a float64 array too.
    np.testing.assert_allclose(m.run(x3.astype(np.float64))["output"], got, rtol=0, atol=0)


def test_from_torch_for_training_trains_what_pytorch_trains(tmp_path):
    # An embedding, a frozen layer (smelt's own rule would train it: its
    # names are a parameter's) and a trained head: from_torch(train=True)
    # passes PyTorch's list.
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.body = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 5)
            self.body.requires_grad_(False)

        def forward(self, ids):
            return self.head(torch.relu(self.body(self.emb(ids)))).mean(dim=1)

    net = Net().eval()
    m = smelt.from_torch(net, torch.randint(0, 10, (4, 6)), train=True)
    pytorch = {n for n, p in net.named_parameters() if p.requires_grad}
    assert pytorch == {"emb.weight", "head.weight", "head.bias"}

    def table(**kw):
        inits = m.plan(train="sgd", loss="ce", **kw).training["initializers"]
        return {i["name"] for i in inits if i["trained"]}, {i["name"]: i["frozen_because"] for i in inits if not i["trained"]}

    trained, frozen = table()
    assert trained == pytorch and set(frozen) == {"body.weight", "body.bias"}, (trained, frozen)
    trained, frozen = table(train_only=["head.*"])
    assert trained == {"head.weight", "head.bias"} and frozen["emb.weight"] == "not named by --trainable or --train-only"
    # Names as a list, or a file of them as the CLI's --trainable.
    assert table(trainable=["head.bias", "emb.weight"])[0] == {"head.bias", "emb.weight"}
    (tmp_path / "names.txt").write_text("# trained\nhead.weight\n")
    assert table(trainable=tmp_path / "names.txt")[0] == {"head.weight"}
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(smelt.UsageError, match="no names in it"):
        table(trainable=tmp_path / "empty.txt")


def test_from_torch_for_training_keeps_equal_parameters_apart():
    # Fresh layer norms (ones and zeros): exported in eval mode, the
    # TorchScript exporter would merge them into one initializer each;
    # from_torch(train=True) exports in training mode, so all train.
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(),
        torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3),
    ).eval()
    m = smelt.from_torch(net, torch.randn(4, 6), train=True)
    inits = m.plan(train="sgd", loss="ce").training["initializers"]
    trained = {i["name"] for i in inits if i["trained"]}
    assert trained == {n for n, _ in net.named_parameters()}, trained


def test_from_torch_for_training_falls_back_to_eval_mode_for_a_functional_dropout():
    # A dropout smelt cannot see as a module: exported in training mode it
    # would drop at random, which smelt refuses; from_torch exports in eval
    # mode instead, and everything still trains.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.l(torch.nn.functional.dropout(x, 0.1, self.training))

    net = Net().eval()
    m = smelt.from_torch(net, torch.randn(4, 6), train=True)
    inits = m.plan(train="sgd", loss="ce").training["initializers"]
    assert {i["name"] for i in inits if i["trained"]} == {"l.weight", "l.bias"}
    assert not net.training


def test_from_torch_transformer_encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    m = smelt.from_torch(enc, x, input_names=["x"], output_names=["y"])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "tenc.onnx"
        m.save(path)
        for batch in (2, 5):
            assert m.plan(batch=batch).to_dict()["plan"] == cli("plan", path, "--batch", batch)["plan"]
        xs = np.random.default_rng(4).standard_normal((5, 8, 32)).astype(np.float32)
        got = m.run({"x": xs})["y"]
        np.testing.assert_allclose(got, onnxruntime_outputs(path, {"x": xs})["y"], rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(got, enc(torch.from_numpy(xs)).numpy(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- run


def test_run_equals_onnxruntime_and_the_shipped_outputs():
    m = smelt.load(SQUEEZENET)
    name = m.inputs[0]["name"]
    x = onnx.numpy_helper.to_array(onnx.load_tensor(str(SQUEEZENET.parent / "input_0.pb")))
    want = onnx.numpy_helper.to_array(onnx.load_tensor(str(SQUEEZENET.parent / "output_0.pb")))
    out = m.run({name: x})
    (got,) = out.values()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, list(onnxruntime_outputs(SQUEEZENET, {name: x}).values())[0], rtol=1e-4, atol=1e-5)
    assert got.flags.writeable and got.dtype == np.float32
    # A list and a bare array are the same call; a strided view is copied first.
    np.testing.assert_array_equal(m.run([x])[m.outputs[0]["name"]], got)
    wide = np.zeros(x.shape[:-1] + (x.shape[-1] * 2,), np.float32)
    wide[..., ::2] = x
    np.testing.assert_array_equal(m.run(wide[..., ::2])[m.outputs[0]["name"]], got)


def test_run_refuses_wrong_inputs():
    m = smelt.load(SQUEEZENET)
    name = m.inputs[0]["name"]
    with pytest.raises(smelt.UsageError, match="must have shape"):
        m.run(np.zeros((1, 3, 10, 10), np.float32))
    with pytest.raises(smelt.UsageError, match="missing"):
        m.run({"nope": np.zeros(m.inputs[0]["shape"], np.float32)})
    with pytest.raises(smelt.UsageError, match="takes 1 inputs"):
        m.run([np.zeros(1), np.zeros(1)])
    with pytest.raises(smelt.UsageError, match=name):
        m.run(np.zeros(m.inputs[0]["shape"], np.complex64))


# ---------------------------------------------------------------- fit, compile


def test_fit_matches_the_cli_and_saves_a_recipe(tmp_path):
    m = smelt.load("zoo:mobilenet_v2")
    f = m.fit(memory_limit="400MiB", batch=16, train="adam", save_recipe=tmp_path / "r.json")
    c = cli("fit", "zoo:mobilenet_v2", "--batch", 16, "--train", "adam", "--memory-limit", "400MiB")
    assert f.recipe == c["recipe"] and f.recipe is not None
    assert f.total_bytes <= smelt.parse_size("400MiB")
    assert json.loads((tmp_path / "r.json").read_text()) == c["recipe"]
    assert [x["verdict"] for x in f.candidates] == [x["verdict"] for x in c["candidates"]]
    assert "<table" in f._repr_html_()
    # precision="auto" searches f32, mixed-bf16 and mixed-f16, as the CLI's.
    a = m.fit(memory_limit="400MiB", batch=16, train="adam", precision="auto")
    c = cli("fit", "zoo:mobilenet_v2", "--batch", 16, "--train", "adam", "--memory-limit", "400MiB", "--precision", "auto")
    assert a.recipe == c["recipe"] and {x["precision"] for x in a.candidates} == {"f32", "mixed-bf16", "mixed-f16"}
    with pytest.raises(smelt.MemoryLimitError) as e:
        m.fit(memory_limit="1MiB", batch=16)
    assert e.value.fit is not None and e.value.fit.recipe is None and e.value.arena > smelt.parse_size("1MiB")
    assert "no recipe of zoo:mobilenet_v2 fits" in str(e.value)


def test_compile_writes_the_kernels_with_progress(tmp_path):
    m = smelt.load(SQUEEZENET)
    seen = []
    import smelt as s

    class Recorder(s._Progress):
        def __call__(self, done, total, name):
            seen.append((done, total, name))

    original = s._Progress
    s._Progress = Recorder
    try:
        b = m.compile(tmp_path / "out", weights=True)
    finally:
        s._Progress = original
    assert b.distinct_kernels == len(seen) and seen[-1][0] == seen[-1][1] == b.distinct_kernels
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["arena_bytes"] == b.arena_bytes and len(plan["steps"]) == b.kernels
    assert len(list((tmp_path / "out" / "kernels").glob("*.ptx"))) == b.distinct_kernels
    assert (tmp_path / "out" / "weights.bin").stat().st_size == plan["weights_bytes"]
    assert (tmp_path / "out" / "memory.svg").read_text().startswith("<svg")


# ---------------------------------------------------------------- errors


def test_errors_raise_their_types():
    with pytest.raises(FileNotFoundError):
        smelt.load("no/such/model.onnx")
    with pytest.raises(smelt.ModelError, match="malformed ONNX"):
        smelt.load(b"not an onnx file")
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(smelt.UnsupportedError, match="Frobnicate") as e:
        smelt.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert not e.value.is_bug and isinstance(e.value, smelt.Error)
    m = smelt.load("zoo:mobilenet_v2")
    with pytest.raises(smelt.UsageError, match="unknown precision .*one of f32") as e:
        m.plan(precision="f64")
    assert isinstance(e.value, ValueError)
    # Options go to the library typed, not as a command line: a value of
    # the wrong type, an unknown name or an option the native layer does not
    # know is refused by name.
    with pytest.raises(smelt.UsageError, match="option lr must be a number, not str"):
        m.plan(train="sgd", lr="fast")
    with pytest.raises(smelt.UsageError, match='unknown optimizer "lion": one of sgd, adam, adamw'):
        m.plan(train="lion")
    with pytest.raises(smelt.UsageError, match="unknown options: frobnicate"):
        smelt._smelt.inspect({"model": "zoo:mobilenet_v2", "frobnicate": 1})
    with pytest.raises(smelt.UsageError, match="lr configure a training step"):
        smelt._smelt.inspect({"model": "zoo:mobilenet_v2", "lr": 0.1})
    # A value that starts with '-' is a value (it was a flag's hazard).
    with pytest.raises(smelt.UsageError, match="--clip-norm must be a positive number"):
        m.plan(train="sgd", clip_norm=-1.0)
    with pytest.raises(TypeError, match="training options"):
        m.plan(train="adam", learning_rate=0.1)
    with pytest.raises(smelt.UsageError, match="need train="):
        m.plan(accumulate=2)
    with pytest.raises(smelt.UsageError, match="not a size"):
        m.plan(memory_limit="lots")
    with pytest.raises(smelt.MemoryLimitError) as e:
        m.plan(batch=8, memory_limit="5MiB")  # below what splitting reaches at batch 8
    err = e.value
    assert err.limit == 5 << 20 and err.arena == err.plan.arena_bytes > err.limit
    assert err.smaller_batch is not None and err.smaller_batch[0] < 8 and err.smaller_batch[1] <= err.limit
    assert any("smaller batch" in a for a in err.advice)
    assert "peak" in str(err)


# ---------------------------------------------------------------- documentation


def test_readme_and_module_examples_run():
    # Each document's examples: as many as it has `>>>` lines, so an
    # example that stopped being seen (a broken fence) fails here.
    for doc in (ROOT / "README.md", ROOT / "docs" / "guide.md"):
        failed, tried = doctest.testfile(str(doc), module_relative=False, optionflags=doctest.ELLIPSIS)
        prompts = sum(1 for line in doc.read_text().splitlines() if line.lstrip().startswith(">>> "))
        assert failed == 0, doc
        assert tried == prompts > 0, f"{doc}: {tried} examples ran of {prompts}"
    failed, tried = doctest.testmod(smelt, optionflags=doctest.ELLIPSIS)
    assert failed == 0 and tried > 0


# ---------------------------------------------------------------- training

RUNS = DATA / "train_runs"


def test_train_is_the_clis_and_pytorchs(tmp_path):
    """Model.train is smelt train: the same checkpoint bit for bit as the
    CLI's, and PyTorch's weights after 20 Adam steps (scripts/make_train_runs.py)
    from arrays given as a dict, on the CPU and on the emulator."""
    d = RUNS / "cnn"
    m = smelt.load(d / "model.onnx")
    flags = dict(optimizer="adam", lr=0.01, batch=32, steps=20, shuffle=False, progress=False)
    py = m.train(d / "train.npz", checkpoint=tmp_path / "py", **flags)
    c = cli("train", d / "model.onnx", "--data", d / "train.npz", "--optimizer", "adam", "--lr", 0.01, "--batch", 32,
            "--steps", 20, "--no-shuffle", "--checkpoint", tmp_path / "cli")
    assert py.steps == c["steps"] == 20 and py.final_loss == c["final_loss"]
    got, want = np.load(tmp_path / "py" / "checkpoint.npz"), np.load(tmp_path / "cli" / "checkpoint.npz")
    assert sorted(got.files) == sorted(want.files)
    for k in want.files:
        assert np.array_equal(got[k], want[k]), k
    arrays = dict(np.load(d / "train.npz"))
    reference = np.load(d / "adam.npz")
    for backend in ["cpu", "emulator"]:
        # Exact f32 on the emulator too (its default is the GPU's TF32 convs).
        t = m.train(arrays, backend=backend, tf32="off", checkpoint=tmp_path / backend, **flags)
        assert t.to_dict()["backend"] == backend
        got = np.load(tmp_path / backend / "checkpoint.npz")
        compared = [k for k in reference.files if k in got.files]
        assert len(compared) >= 4, compared
        for k in compared:
            w = reference[k]
            assert np.allclose(got[k], w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max()))), (backend, k)


def test_train_refuses_as_the_cli_and_saves_a_model_onnxruntime_runs(tmp_path):
    d = RUNS / "mlp"
    m = smelt.load(d / "model.onnx")
    with pytest.raises(smelt.UsageError, match="is SGD's"):
        m.train(d / "train.npz", optimizer="adam", momentum=0.9, batch=8, steps=1, progress=False)
    with pytest.raises(smelt.UsageError, match="invalid learning rate"):
        m.train(d / "train.npz", optimizer="sgd", lr=-1.0, batch=8, steps=1, progress=False)
    with pytest.raises(smelt.MemoryLimitError):
        m.train(d / "train.npz", batch=8, steps=1, memory_limit="1KiB", progress=False)
    seen = []
    out = tmp_path / "trained.onnx"
    t = m.train(d / "train.npz", optimizer="sgd", lr=0.05, batch=8, steps=5, val=d / "val.npz", save=out, progress=False)
    assert t.validation["samples"] == 200 and t.to_dict()["saved"] == str(out)
    x = np.load(d / "val.npz")["x"][:1].astype(np.float32)
    want = onnxruntime_outputs(out, {"x": x})
    got = smelt.load(out).run(x)
    for k in want:
        assert np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5), k
    assert "loss" in repr(t) and "validation loss" in t._repr_html_()
    del seen


def test_run_on_the_emulator_is_onnxruntimes():
    """Model.run(backend="emulator") runs the program smelt run --backend
    emulator runs (the generated CUDA C), against onnxruntime."""
    d = RUNS / "mlp"
    m = smelt.load(d / "model.onnx", batch=4)
    x = np.load(d / "val.npz")["x"][:4].astype(np.float32)
    want = onnxruntime_outputs(d / "model.onnx", {"x": x})
    for backend in ["cpu", "emulator"]:
        got = m.run(x, backend=backend)
        for k in want:
            assert np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5), (backend, k)
    with pytest.raises(smelt.UsageError, match="unknown backend"):
        m.run(x, backend="tpu")


def test_train_takes_a_recipe_from_fit(tmp_path):
    """A recipe fixes batch and dimensions: a model loaded with a batch
    trains from it (the model's own batch left out), and one given beside
    it is refused."""
    d = RUNS / "mlp"
    m = smelt.load(d / "model.onnx", batch=8)
    recipe = tmp_path / "recipe.json"
    m.fit(memory_limit="1MiB", batch=16, train="sgd", save_recipe=recipe)
    t = m.train(d / "train.npz", optimizer="sgd", steps=2, recipe=recipe, progress=False)
    assert t.to_dict()["batch"] == 16
    with pytest.raises(smelt.UsageError, match="the recipe fixes"):
        m.train(d / "train.npz", optimizer="sgd", steps=2, recipe=recipe, batch=4, progress=False)
    with pytest.raises(smelt.UsageError, match="at least 1"):
        m.train(d / "train.npz", optimizer="sgd", steps=2, checkpoint=tmp_path / "ck", every=0, progress=False)
