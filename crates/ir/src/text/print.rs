//! The printer.

use super::INLINE_LIMIT;
use crate::graph::Graph;
use crate::kernel_op::OpSet;
use crate::tensor::{Tensor, TensorData};
use std::fmt::Write;

/// Prints `g` in the text format.
pub fn print<O: OpSet>(g: &Graph<O>) -> String {
    let mut s = String::from("graph {\n");
    // A graph with a cycle cannot be printed in order; fall back to index order.
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    for id in order {
        let n = g.node(id);
        write!(s, "  {id}").unwrap();
        if !n.name.is_empty() {
            write!(s, " {}", quote(&n.name)).unwrap();
        }
        write!(s, " = {}", n.op.name()).unwrap();
        let ins = g.inputs_of(id);
        if !ins.is_empty() {
            let list: Vec<String> = ins.iter().map(|v| v.to_string()).collect();
            write!(s, "({})", list.join(", ")).unwrap();
        }
        let attrs = n.op.attrs();
        if !attrs.is_empty() {
            let list: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            write!(s, " {{{}}}", list.join(", ")).unwrap();
        }
        let tys: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
        write!(s, " : {}", tys.join(", ")).unwrap();
        if n.op.is_persistent() {
            if let Some(w) = g.weight(id).filter(|w| w.ty().numel() <= INLINE_LIMIT) {
                let vals: Vec<String> = match w.data() {
                    TensorData::F32(v) => v.iter().map(|x| format!("{x:?}")).collect(),
                    TensorData::F16(v) => v.iter().map(|x| format!("{:?}", x.to_f32())).collect(),
                    TensorData::BF16(v) => v.iter().map(|x| format!("{:?}", x.to_f32())).collect(),
                    TensorData::I64(v) => v.iter().map(|x| x.to_string()).collect(),
                    TensorData::I32(v) => v.iter().map(|x| x.to_string()).collect(),
                    TensorData::Bool(v) => v.iter().map(|&x| (x as u8).to_string()).collect(),
                    other => {
                        Tensor::new(vec![other.len()], other.clone()).expect("flat").to_i64_vec().iter().map(|x| x.to_string()).collect()
                    }
                };
                write!(s, " = [{}]", vals.join(",")).unwrap();
            }
        }
        s.push('\n');
    }
    for (name, v) in g.outputs() {
        writeln!(s, "  output {} = {v}", quote(name)).unwrap();
    }
    s.push_str("}\n");
    s
}

/// A string literal: double quotes, with `\"`, `\\` and `\n` escaped.
pub(crate) fn quote(name: &str) -> String {
    let mut q = String::with_capacity(name.len() + 2);
    q.push('"');
    for c in name.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}
