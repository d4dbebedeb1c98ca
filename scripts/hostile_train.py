#!/usr/bin/env python3
"""Issue 44's hostile cases against `smelt train`, counted by class.

Each case runs the `smelt` binary given (default target/debug/smelt) on the
light training models of the test data (scripts/fetch-testdata.sh) and is
judged:

- right: refused with exit 2 and a message that says what is wrong, before
  any work is lost, or handled correctly (a resumed run equal bit for bit
  to the uninterrupted one, NaN where onnxruntime has NaN, a model intact
  after a failed save);
- crash: killed by a signal, a panic, an abort, or no answer in time;
- silent: exit 0 with a wrong or ignored input;
- unclear: refused, but late (after training) or with a message that names
  the wrong thing.

Run it on two builds to compare them (an older one from `git worktree add`):

    .venv/bin/python scripts/hostile_train.py [--smelt BIN] [--kills N] [--json]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("SMELT_TESTDATA", os.path.join(ROOT, ".testdata"))
RUNS = os.path.join(DATA, "train_runs")
MLP = os.path.join(RUNS, "mlp", "model.onnx")
MLP_DATA = os.path.join(RUNS, "mlp", "train.npz")
CNN = os.path.join(RUNS, "cnn", "model.onnx")
CNN_DATA = os.path.join(RUNS, "cnn", "train.npz")

args = None
tmp = None
results = {}  # class -> list of (case, outcome, detail)


def run(cmd, timeout=180, limit_file_kib=None):
    """(exit code, stdout, stderr) of smelt with `cmd`; code None on timeout."""
    pre = None
    if limit_file_kib is not None:
        import resource

        def pre():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_kib * 1024, limit_file_kib * 1024))

    try:
        p = subprocess.run([args.smelt] + cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=pre)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timeout"


def crashed(code, err):
    return code is None or code < 0 or code in (101, 134) or "panicked" in err or "memory allocation" in err


def judge_refusal(code, err, says=None, before_training=True):
    """A case that must be refused: exit 2, a message (containing `says`)."""
    if crashed(code, err):
        return "crash", err.strip().splitlines()[-1:] if err.strip() else [f"exit {code}"]
    if code == 0:
        return "silent", ["exit 0"]
    lines = err.strip().splitlines()
    last = next((line for line in lines if line.startswith("error")), lines[-1] if lines else "")
    began = any(line.startswith("training ") for line in err.splitlines())
    if code != 2 or (says and says not in err) or (before_training and began):
        return "unclear", [f"exit {code}: {last}"]
    return "right", [last]


def case(cls, name, outcome):
    kind, detail = outcome
    results.setdefault(cls, []).append((name, kind, detail))


def train(*a, **kw):
    return run(["train", *a], **kw)


def savez(path, arrays):
    np.savez(path, **arrays)
    return path


def load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def checkpoint(name, model=MLP, data=MLP_DATA, flags=()):
    """A checkpoint folder made by the binary under test."""
    d = os.path.join(tmp, name)
    shutil.rmtree(d, ignore_errors=True)
    base = ["--optimizer", "adam", "--batch", "8", "--steps", "4"] if not flags else list(flags)
    code, _, err = train(model, "--data", data, *base, "--checkpoint", d)
    if code != 0:
        sys.exit(f"cannot make a checkpoint: {err}")
    return d


def edit_checkpoint(d, arrays=None, meta=None):
    """Rewrites a checkpoint consistently (archive and its committed size):
    the values themselves are what is hostile, not the packaging."""
    mp = os.path.join(d, "checkpoint.json")
    m = json.load(open(mp))
    archive = os.path.join(d, m.get("arrays") or "checkpoint.npz")
    if arrays is not None:
        a = load(archive)
        arrays(a)
        if os.path.islink(archive):
            os.unlink(archive)
        np.savez(archive, **a)
        if "arrays_bytes" in m:
            m["arrays_bytes"] = os.path.getsize(archive)
    if meta is not None:
        meta(m)
    json.dump(m, open(mp, "w"))


def resume(d, model=MLP, data=MLP_DATA, flags=("--optimizer", "adam", "--batch", "8")):
    return train(model, "--data", data, *flags, "--steps", "8", "--resume", d)


# ------------------------------------------------------------------ classes


def declared_sizes():
    cls = "declared sizes trusted"
    # An .npy header claiming a terabyte over a kilobyte of data.
    p = os.path.join(tmp, "tib.npz")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (274877906944,), }"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(1024)
    y = np.zeros(520, np.int64)
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", npy)
        buf = tempfile.SpooledTemporaryFile()
        np.save(buf, y)
        buf.seek(0)
        z.writestr("y.npy", buf.read())
    code, _, err = train(MLP, "--data", p, "--optimizer", "sgd", "--batch", "8", "--steps", "1")
    case(cls, "header claims 1 TiB over 1 KiB", judge_refusal(code, err))
    for flag, n in [("--steps", "1000000000"), ("--steps", "18446744073709551615"), ("--epochs", "18446744073709551615")]:
        code, _, err = train(MLP, "--data", MLP_DATA, "--optimizer", "sgd", "--batch", "8", flag, n, timeout=60)
        case(cls, f"{flag} {n}", judge_refusal(code, err))


def crc():
    cls = "zip CRC-32 not checked"
    raw = open(MLP_DATA, "rb").read()
    with zipfile.ZipFile(MLP_DATA) as z:
        info = z.getinfo("y.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 128  # past the .npy header
    for i, off in enumerate([8, 800, 2400]):
        b = bytearray(raw)
        b[start + off] ^= 0x01
        p = os.path.join(tmp, f"flip{i}.npz")
        open(p, "wb").write(bytes(b))
        code, _, err = train(MLP, "--data", p, "--optimizer", "sgd", "--batch", "8", "--steps", "1")
        case(cls, f"a label bit flipped (byte {off})", judge_refusal(code, err))
    d = checkpoint("crc")
    m = json.load(open(os.path.join(d, "checkpoint.json")))
    archive = os.path.join(d, m.get("arrays") or "checkpoint.npz")
    archive = os.path.realpath(archive)
    b = bytearray(open(archive, "rb").read())
    b[len(b) // 3] ^= 0x40
    open(archive, "wb").write(bytes(b))
    code, _, err = resume(d)
    case(cls, "a checkpoint bit flipped", judge_refusal(code, err))


def checkpoint_values():
    cls = "checkpoint values not validated"

    def weight(a):
        return next(k for k in a if k.endswith("weight") and not k.endswith((".adam_m", ".adam_v")))

    edits = [
        ("a NaN weight", lambda a: a[weight(a)].__setitem__((0, 0), np.nan), MLP, MLP_DATA, None),
        ("an infinite weight", lambda a: a[weight(a)].__setitem__((0, 0), np.inf), MLP, MLP_DATA, None),
        ("Adam's v at -1", lambda a: a[next(k for k in a if k.endswith(".adam_v"))].fill(-1.0), MLP, MLP_DATA, None),
    ]
    for name, f, model, data, _ in edits:
        d = checkpoint("values")
        edit_checkpoint(d, arrays=f)
        code, _, err = resume(d, model, data)
        case(cls, name, judge_refusal(code, err))
    f16 = ("--optimizer", "adam", "--batch", "8", "--precision", "mixed-f16")
    for name, scaler in [
        ("loss scale 0", {"scale": 0.0, "clean": 0, "skipped": 0}),
        ("loss scale -1", {"scale": -1.0, "clean": 0, "skipped": 0}),
        ("9 skipped of 4 steps", {"scale": 1024.0, "clean": 0, "skipped": 9}),
    ]:
        d = checkpoint("scaler", flags=f16 + ("--steps", "4"))
        edit_checkpoint(d, meta=lambda m: m.__setitem__("scaler", scaler))
        code, _, err = resume(d, flags=f16)
        case(cls, name, judge_refusal(code, err))


def missing_arrays():
    cls = "missing checkpoint arrays re-initialized"
    for name, pick in [
        ("a bias", lambda k: k.endswith("bias") and "adam" not in k),
        ("Adam's m", lambda k: k.endswith(".adam_m")),
        ("the step counter", lambda k: k == "train.step"),
    ]:
        d = checkpoint("missing")

        def drop(a):
            for k in [k for k in a if pick(k)][:1]:
                del a[k]

        edit_checkpoint(d, arrays=drop)
        code, _, err = resume(d)
        case(cls, f"without {name}", judge_refusal(code, err))


def disagreeing_files():
    cls = "checkpoint files disagree"
    common = ["--data", CNN_DATA, "--optimizer", "adam", "--batch", "32", "--seed", "3", "--steps", "16"]
    whole = os.path.join(tmp, "whole")
    shutil.rmtree(whole, ignore_errors=True)
    t = time.time()
    code, _, err = train(CNN, *common, "--checkpoint", whole)
    assert code == 0, err
    span = time.time() - t
    want = load(os.path.join(whole, "checkpoint.npz"))
    for k in range(args.kills):
        d = os.path.join(tmp, f"kill{k}")
        shutil.rmtree(d, ignore_errors=True)
        p = subprocess.Popen([args.smelt, "train", CNN, *common, "--checkpoint", d, "--every", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(span * (0.15 + 0.8 * k / max(args.kills, 1)) + 0.003 * k)
        p.kill()
        p.wait()
        meta = os.path.join(d, "checkpoint.json")
        at = json.load(open(meta)).get("step") if os.path.exists(meta) else 0
        again = ["--checkpoint", d] + (["--resume", d] if os.path.exists(meta) else [])
        code, _, err = train(CNN, *common, *again)
        if crashed(code, err):
            case(cls, f"kill -9 #{k}", ("crash", [err.strip()[-200:]]))
        elif code != 0:
            case(cls, f"kill -9 #{k}", ("unclear", [err.strip().splitlines()[-1]]))
        else:
            got = load(os.path.join(d, "checkpoint.npz"))
            same = want.keys() == got.keys() and all(np.array_equal(want[n], got[n]) for n in want)
            case(cls, f"kill -9 #{k} (after step {at})", ("right", ["resumed to the same weights"]) if same else ("silent", ["resumed to other weights"]))
    d = checkpoint("step0")
    edit_checkpoint(d, meta=lambda m: m.__setitem__("step", 0))
    code, _, err = resume(d)
    case(cls, "checkpoint.json edited to step 0", judge_refusal(code, err))


def saves():
    cls = "--save not atomic or checked late"
    m = os.path.join(tmp, "mlp.onnx")
    shutil.copy(MLP, m)
    code, _, err = train(m, "--data", MLP_DATA, "--optimizer", "sgd", "--batch", "8", "--steps", "2", "--save", m, limit_file_kib=1)
    ok = run(["inspect", m])[0] == 0
    case(cls, "--save onto the input, cut short at 1 KiB", ("right", ["the model is intact"]) if ok and code != 0 else ("silent", [f"exit {code}, the model {'loads' if ok else 'is broken'}"]))
    code, _, err = train(MLP, "--data", MLP_DATA, "--optimizer", "sgd", "--batch", "8", "--steps", "2", "--save", "/nonexistent-dir/t.onnx")
    case(cls, "--save into a missing folder", judge_refusal(code, err, before_training=True))


def nan_propagation():
    cls = "NaN not propagated"
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    for name, model, shape in [("MLP (ReLU)", MLP, (1, 10)), ("CNN (ReLU, max pool)", CNN, (1, 1, 8, 8))]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        x.flat[3] = np.nan
        inp = os.path.join(tmp, "nan_in.pb")
        open(inp, "wb").write(numpy_helper.from_array(x, "x").SerializeToString())
        want = ort.InferenceSession(model).run(None, {"x": x})[0]
        out = os.path.join(tmp, "nan_out")
        shutil.rmtree(out, ignore_errors=True)
        code, _, err = run(["run", model, "--input", inp, "--save-outputs", out, "--backend", "cpu"])
        if crashed(code, err) or code != 0:
            case(cls, name, ("crash" if crashed(code, err) else "unclear", [err.strip()[-200:]]))
            continue
        t = onnx.TensorProto()
        t.ParseFromString(open(os.path.join(out, "output_0.pb"), "rb").read())
        got = numpy_helper.to_array(t)
        same = np.array_equal(np.isnan(got), np.isnan(want))
        case(cls, name, ("right", ["NaN where onnxruntime has NaN"]) if same else ("silent", [f"{int(np.isnan(got).sum())} NaN, onnxruntime {int(np.isnan(want).sum())}"]))


def out_of_domain():
    cls = "out-of-domain optimizer values"
    for flags in [("sgd", "--lr=-0.1"), ("sgd", "--momentum=-1"), ("adam", "--weight-decay=-1"), ("sgd", "--lr=NaN"), ("adamw", "--lr=inf")]:
        code, _, err = train(MLP, "--data", MLP_DATA, "--batch", "8", "--steps", "2", "--optimizer", *flags)
        case(cls, " ".join(flags), judge_refusal(code, err, says="invalid"))


def ignored():
    cls = "flags and data ignored"
    recipe = os.path.join(tmp, "recipe.json")
    run(["fit", MLP, "--batch", "8", "--train", "sgd", "--memory-limit", "1MiB", "--save-recipe", recipe])
    a = load(MLP_DATA)
    both = savez(os.path.join(tmp, "both.npz"), {"x": a["x"], "y": a["y"], "labels": a["y"]})
    sets = "x=" + ",".join(["0.5"] * 80)
    base = [MLP, "--data", MLP_DATA, "--steps", "1"]
    for name, flags in [
        ("--dim batch=4 beside --batch 8", base + ["--optimizer", "sgd", "--batch", "8", "--dim", "batch=4"]),
        ("--momentum with Adam", base + ["--optimizer", "adam", "--batch", "8", "--momentum", "0.9"]),
        ("--label-smoothing with MSE", base + ["--optimizer", "sgd", "--batch", "8", "--loss", "mse", "--label-smoothing", "0.1"]),
        ("--remat-solver beside --recipe", base + ["--recipe", recipe, "--remat-solver", "exact"]),
        ("--device beside --recipe", base + ["--recipe", recipe, "--device", "a100"]),
        ("--dim beside --recipe", base + ["--recipe", recipe, "--dim", "batch=3"]),
        ("y and labels both", [MLP, "--data", both, "--steps", "1", "--optimizer", "sgd", "--batch", "8"]),
        ("--set x over the data's x", base + ["--optimizer", "sgd", "--batch", "8", "--set", sets]),
        ("--memory-limit 99999999TiB", base + ["--optimizer", "sgd", "--batch", "8", "--memory-limit", "99999999TiB"]),
    ]:
        code, _, err = train(*flags)
        case(cls, name, judge_refusal(code, err))


def messages():
    cls = "messages"
    a = load(MLP_DATA)
    cut = os.path.join(tmp, "cut.npz")
    raw = open(MLP_DATA, "rb").read()
    open(cut, "wb").write(raw[: len(raw) // 2])
    code, _, err = train(MLP, "--data", cut, "--optimizer", "sgd", "--batch", "8", "--steps", "1")
    case(cls, "a damaged .npz named as such", judge_refusal(code, err) if "ONNX" not in err else ("unclear", [err.strip().splitlines()[-1]]))
    u8 = savez(os.path.join(tmp, "u8.npz"), {"x": a["x"].astype(np.uint8), "y": a["y"]})
    code, _, err = train(MLP, "--data", u8, "--optimizer", "sgd", "--batch", "8", "--steps", "1")
    case(cls, "uint8 floats reported as uint8", judge_refusal(code, err, says="u8"))
    nox = savez(os.path.join(tmp, "nox.npz"), {"z": a["x"], "y": a["y"]})
    code, _, err = train(MLP, "--data", nox, "--optimizer", "sgd", "--batch", "8", "--steps", "1")
    case(cls, "no 'x': looked for it once", judge_refusal(code, err) if "'x' or 'x'" not in err else ("unclear", [err.strip().splitlines()[-1]]))
    if os.path.exists("/dev/full"):
        code, _, err = train(MLP, "--data", MLP_DATA, "--optimizer", "sgd", "--batch", "8", "--steps", "1", "--log-json", "/dev/full")
        case(cls, "--log-json /dev/full names the path", judge_refusal(code, err, says="/dev/full", before_training=False))
    up = os.path.join(tmp, "MLP.ONNX")
    shutil.copy(MLP, up)
    code, _, err = train(up, "--data", MLP_DATA, "--optimizer", "sgd", "--batch", "8", "--steps", "1", "--save", os.path.join(tmp, "OUT.ONNX"))
    case(cls, "--save MLP.ONNX", ("right", ["saved"]) if code == 0 else ("unclear", [err.strip().splitlines()[-1]]))
    table = os.path.join(tmp, "tuning.json")
    json.dump({"device": "NVIDIA H100", "tiles": {}, "kernels": []}, open(table, "w"))
    code, _, err = run(["fit", MLP, "--batch", "8", "--train", "sgd", "--memory-limit", "1MiB", "--tuning", table])
    case(cls, "fit --tuning (as the guide says)", ("right", ["accepted"]) if code == 0 else ("unclear", [err.strip().splitlines()[-1]]))


def main():
    global args, tmp
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smelt", default=os.path.join(ROOT, "target", "debug", "smelt"))
    p.add_argument("--kills", type=int, default=10, help="kill -9 instants (default 10)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true", help="list every case, not only the wrong ones")
    args = p.parse_args()
    if not os.path.exists(os.path.join(RUNS, ".done")):
        sys.exit(f"test data missing under {RUNS}: run scripts/fetch-testdata.sh")
    tmp = tempfile.mkdtemp(prefix="smelt-hostile-")
    try:
        for f in [declared_sizes, crc, checkpoint_values, missing_arrays, disagreeing_files, saves, nan_propagation, out_of_domain, ignored, messages]:
            f()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    kinds = ["right", "crash", "silent", "unclear"]
    print(f"{'class':42} {'cases':>5} " + " ".join(f"{k:>7}" for k in kinds))
    for cls, cs in results.items():
        print(f"{cls:42} {len(cs):5} " + " ".join(f"{sum(1 for c in cs if c[1] == k):7}" for k in kinds))
    total = [c for cs in results.values() for c in cs]
    print(f"{'all':42} {len(total):5} " + " ".join(f"{sum(1 for c in total if c[1] == k):7}" for k in kinds))
    for cls, cs in results.items():
        for name, kind, detail in cs:
            if kind != "right" or args.verbose:
                print(f"  {kind:7} {cls}: {name}: {' '.join(detail)[:160]}")


if __name__ == "__main__":
    main()
