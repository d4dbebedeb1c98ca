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


if __name__ == "__main__":
    main()
