"""Writes ONNX's node conformance suite from the onnx wheel's generators.

    .testdata/onnx-node/<case>/model.onnx
    .testdata/onnx-node/<case>/test_data_set_<i>/{input,output}_<j>.pb
    .testdata/onnx-node/index.tsv   case, op tested, dtypes of its values

`onnx.backend.test.case.node.collect_testcases` builds every case (model,
inputs, expected outputs) with numpy; nothing is downloaded or committed.
Cases whose values are sequences, optionals or maps are left out (smelt
has tensors only); index.tsv counts them.
"""

import os
import re
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

OUT = os.path.join(".testdata", "onnx-node")
EXTRA = os.path.join(".testdata", "onnx-node-extra")


def dtype_name(elem_type):
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def value_types(model):
    """Element types of the graph's inputs and outputs, or None when one is not a tensor."""
    names = set()
    for v in list(model.graph.input) + list(model.graph.output):
        if not v.type.HasField("tensor_type"):
            return None
        names.add(dtype_name(v.type.tensor_type.elem_type))
    return names


def tested_op(case):
    """The op a case is about: its only node, or the op its name expands."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return nodes[0].op_type, nodes[0].domain or "ai.onnx"
    # `_expanded` cases hold a function's body; the op is the original's.
    base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
    return None, base


def write_tensor(path, value, name):
    with open(path, "wb") as f:
        if isinstance(value, onnx.TensorProto):
            named = onnx.TensorProto()
            named.CopyFrom(value)
            named.name = name
            f.write(named.SerializeToString())
        else:
            f.write(numpy_helper.from_array(np.asarray(value), name).SerializeToString())


def main():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    by_name = {c.name: c for c in cases}
    rows, left_out = [], 0
    for case in sorted(cases, key=lambda c: c.name):
        types = value_types(case.model)
        if types is None:
            left_out += 1
            continue
        op, domain = tested_op(case)
        if op is None:
            original = by_name.get(domain)
            if original is not None and len(original.model.graph.node) == 1:
                op, domain = original.model.graph.node[0].op_type, original.model.graph.node[0].domain or "ai.onnx"
            else:
                op, domain = case.model.graph.node[0].op_type, case.model.graph.node[0].domain or "ai.onnx"
        d = os.path.join(OUT, case.name)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            s = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(s)
            for j, x in enumerate(inputs):
                write_tensor(os.path.join(s, f"input_{j}.pb"), x, case.model.graph.input[j].name)
            for j, y in enumerate(outputs):
                write_tensor(os.path.join(s, f"output_{j}.pb"), y, case.model.graph.output[j].name)
        rows.append(f"{case.name}\t{domain}\t{op}\t{','.join(sorted(types))}")
    with open(os.path.join(OUT, "index.tsv"), "w") as f:
        f.write("# case\tdomain\top\tvalue dtypes\n")
        f.write("\n".join(rows) + "\n")
    print(
        f"make_node_cases: {len(rows)} cases written, {left_out} with sequence, optional or map values left out",
        file=sys.stderr,
    )


def extra_cases():
    """float32 cases for forms the suite has only in double (Einsum's
    scalar, inner product, ellipsis; CumSum), expected values from numpy
    in float64: written like the suite's, under EXTRA."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    cases = []
    for name, eq, shapes in [
        ("einsum_batch_matmul", "bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("einsum_inner_prod", "i,i", [(5,), (5,)]),
        ("einsum_scalar", "->", [()]),
        ("einsum_sum", "ij->i", [(3, 4)]),
        ("einsum_transpose", "ij->ji", [(3, 4)]),
        ("einsum_implicit", "ij,jk", [(3, 4), (4, 5)]),
        ("einsum_ellipsis", "...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
        ("einsum_outer", "i,j->ij", [(3,), (4,)]),
        ("einsum_three", "ij,jk,k->i", [(2, 3), (3, 4), (4,)]),
    ]:
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        y = np.einsum(eq, *[x.astype(np.float64) for x in xs]).astype(np.float32)
        node = helper.make_node("Einsum", [f"x{i}" for i in range(len(xs))], ["y"], equation=eq)
        cases.append((name, node, xs, y, [], 12))
    for shape, axis in [((7,), 0), ((3, 5), 1), ((2, 9, 4), -2)]:
        for exclusive in (0, 1):
            for reverse in (0, 1):
                x = rng.standard_normal(shape).astype(np.float32)
                x.flat[2] = np.inf
                v = np.flip(x, axis) if reverse else x
                # Exclusive: the sum of the elements strictly before.
                y = np.cumsum(np.concatenate([np.zeros_like(np.take(v, [0], axis)), np.delete(v, -1, axis)], axis) if exclusive else v, axis=axis, dtype=np.float64)
                y = (np.flip(y, axis) if reverse else y).astype(np.float32)
                node = helper.make_node("CumSum", ["x0", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
                ax = numpy_helper.from_array(np.array(axis, dtype=np.int64), "axis")
                name = f"cumsum_{len(shape)}d_axis{axis}_ex{exclusive}_rev{reverse}"
                cases.append((name, node, [x], y, [ax], 14))
    if os.path.exists(EXTRA):
        shutil.rmtree(EXTRA)
    rows = []
    for name, node, xs, y, inits, opset in cases:
        inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)) for i, x in enumerate(xs)]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y.shape))
        model = helper.make_model(helper.make_graph([node], name, inputs, [out], inits), opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        d = os.path.join(EXTRA, "test_" + name)
        s = os.path.join(d, "test_data_set_0")
        os.makedirs(s)
        onnx.save(model, os.path.join(d, "model.onnx"))
        for j, x in enumerate(xs):
            write_tensor(os.path.join(s, f"input_{j}.pb"), x, f"x{j}")
        write_tensor(os.path.join(s, "output_0.pb"), y, "y")
        rows.append(f"test_{name}\tai.onnx\t{node.op_type}\tfloat")
    with open(os.path.join(EXTRA, "index.tsv"), "w") as f:
        f.write("# case\tdomain\top\tvalue dtypes\n" + "\n".join(rows) + "\n")
    print(f"make_node_cases: {len(rows)} extra float32 cases written", file=sys.stderr)


if __name__ == "__main__":
    main()
    extra_cases()
