//! The parser: one statement per line.

use super::attrs::{Attr, Attrs};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::{Graph, Node, NodeId, ValueId};
use crate::kernel_op::{KernelGraph, OpSet};
use crate::op::Op;
use crate::tensor::{Tensor, TensorData};
use half::{bf16, f16};
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Value(usize, u32),
    Str(String),
    Ident(String),
    Num(String),
    Punct(char),
}

fn lex(line: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = line.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    let digits = |i: &mut usize| {
        let s = *i;
        while *i < cs.len() && cs[*i].is_ascii_digit() {
            *i += 1;
        }
        cs[s..*i].iter().collect::<String>()
    };
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '%' {
            i += 1;
            let n = digits(&mut i).parse().map_err(|_| "expected a node number after %".to_string())?;
            let mut slot = 0;
            if i < cs.len() && cs[i] == ':' && cs.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
                i += 1;
                slot = digits(&mut i).parse().map_err(|_| "slot number too large".to_string())?;
            }
            out.push(Tok::Value(n, slot));
        } else if c == '"' {
            i += 1;
            let mut s = String::new();
            loop {
                match cs.get(i) {
                    None => return Err("unterminated string".into()),
                    Some('"') => break,
                    Some('\\') => {
                        i += 1;
                        match cs.get(i) {
                            Some('n') => s.push('\n'),
                            Some(&c @ ('"' | '\\')) => s.push(c),
                            _ => return Err("bad escape in string".into()),
                        }
                    }
                    Some(&c) => s.push(c),
                }
                i += 1;
            }
            i += 1;
            out.push(Tok::Str(s));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(cs[s..i].iter().collect()));
        } else if c.is_ascii_digit() || (c == '-' && cs.get(i + 1).is_some_and(|c| c.is_ascii_digit() || *c == 'i')) {
            let s = i;
            i += 1;
            while i < cs.len()
                && (cs[i].is_ascii_alphanumeric() || cs[i] == '.' || ((cs[i] == '-' || cs[i] == '+') && matches!(cs[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            out.push(Tok::Num(cs[s..i].iter().collect()));
        } else if "=(){}[],:".contains(c) {
            out.push(Tok::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    Ok(out)
}

struct Cursor {
    toks: Vec<Tok>,
    pos: usize,
}

impl Cursor {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn next(&mut self) -> Result<Tok, String> {
        let t = self.toks.get(self.pos).cloned().ok_or("unexpected end of line")?;
        self.pos += 1;
        Ok(t)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{c}', found {}", self.peek().map_or("end of line".into(), |t| format!("{t:?}"))))
        }
    }
    fn done(&self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(format!("unexpected {t:?} at end of line")),
        }
    }
    fn ident(&mut self) -> Result<String, String> {
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            t => Err(format!("expected a name, found {t:?}")),
        }
    }
    /// `[a,b,...]` of raw number tokens.
    fn num_list(&mut self) -> Result<Vec<String>, String> {
        self.expect('[')?;
        let mut v = Vec::new();
        while !self.eat(']') {
            if !v.is_empty() {
                self.expect(',')?;
            }
            match self.next()? {
                Tok::Num(s) | Tok::Ident(s) => v.push(s),
                t => Err(format!("expected a number, found {t:?}"))?,
            }
        }
        Ok(v)
    }
    fn ty(&mut self) -> Result<TensorType, String> {
        let d = self.ident()?;
        let dtype = DType::from_name(&d).ok_or_else(|| format!("unknown dtype {d}"))?;
        let dims =
            self.num_list()?.iter().map(|s| s.parse::<usize>().map_err(|_| format!("bad dimension {s}"))).collect::<Result<Vec<_>, _>>()?;
        let ty = TensorType::new(dtype, dims);
        if ty.checked_bytes().is_none() {
            return Err(format!("type {ty} is absurdly large"));
        }
        Ok(ty)
    }
    fn attr(&mut self) -> Result<Attr, String> {
        if self.peek() == Some(&Tok::Punct('[')) {
            let v = self.num_list()?;
            return v.iter().map(|s| s.parse().map_err(|_| format!("bad integer {s}"))).collect::<Result<_, _>>().map(Attr::Ints);
        }
        match self.next()? {
            Tok::Ident(s) if s == "true" || s == "false" => Ok(Attr::Bool(s == "true")),
            Tok::Ident(s) if s == "inf" || s == "NaN" => Ok(Attr::Float(s.parse().expect("inf and NaN parse"))),
            Tok::Ident(s) => DType::from_name(&s).map(Attr::DType).ok_or_else(|| format!("bad attribute value {s}")),
            Tok::Str(s) => Ok(Attr::Str(s)),
            Tok::Num(s) if s.contains(['.', 'e', 'E', 'i']) => s.parse().map(Attr::Float).map_err(|_| format!("bad float {s}")),
            Tok::Num(s) => s.parse().map(Attr::Int).map_err(|_| format!("bad integer {s}")),
            t => Err(format!("bad attribute value {t:?}")),
        }
    }
}

struct Stmt<O> {
    line: usize,
    name: String,
    op: O,
    inputs: Vec<(usize, u32)>,
    outputs: Vec<TensorType>,
    values: Option<Vec<String>>,
}

fn values_tensor(ty: &TensorType, vals: &[String]) -> Result<Tensor, String> {
    if vals.len() != ty.numel() {
        return Err(format!("{} values for type {ty}", vals.len()));
    }
    let f = |s: &String| s.parse::<f32>().map_err(|_| format!("bad number {s}"));
    let i = |s: &String| s.parse::<i64>().map_err(|_| format!("bad integer {s}"));
    let data = match ty.dtype {
        DType::F32 => TensorData::F32(vals.iter().map(f).collect::<Result<_, _>>()?),
        DType::F16 => TensorData::F16(vals.iter().map(|s| f(s).map(f16::from_f32)).collect::<Result<_, _>>()?),
        DType::BF16 => TensorData::BF16(vals.iter().map(|s| f(s).map(bf16::from_f32)).collect::<Result<_, _>>()?),
        DType::I64 => TensorData::I64(vals.iter().map(i).collect::<Result<_, _>>()?),
        DType::I32 => TensorData::I32(
            vals.iter()
                .map(|s| i(s).and_then(|x| i32::try_from(x).map_err(|_| format!("{x} does not fit i32"))))
                .collect::<Result<_, _>>()?,
        ),
        DType::Bool => TensorData::Bool(
            vals.iter()
                .map(|s| match i(s)? {
                    0 => Ok(false),
                    1 => Ok(true),
                    x => Err(format!("{x} is not a bool (0 or 1)")),
                })
                .collect::<Result<_, _>>()?,
        ),
        small => {
            // 8- to 32-bit integers: each must fit its type.
            let v = vals.iter().map(i).collect::<Result<Vec<i64>, _>>()?;
            let t = Tensor::from_i64(ty.shape.clone(), v.clone()).cast(small);
            if let Some((x, _)) = v.iter().zip(t.to_i64_vec()).find(|(a, b)| *a != b) {
                return Err(format!("{x} does not fit {small}"));
            }
            return Ok(t);
        }
    };
    Ok(Tensor::new(ty.shape.clone(), data).expect("count checked above"))
}

/// Parses a graph of semantic ops in the text format and verifies it.
pub fn parse(text: &str) -> Result<Graph, IrError> {
    parse_as(text)
}

/// Parses a kernel-level graph (what `--dump-ir` prints after fusion) and
/// verifies it.
pub fn parse_kernel(text: &str) -> Result<KernelGraph, IrError> {
    parse_as(text)
}

/// Parses a graph of either level ([`parse`], [`parse_kernel`]) and verifies it.
pub fn parse_as<O: OpSet>(text: &str) -> Result<Graph<O>, IrError> {
    let mut stmts: BTreeMap<usize, Stmt<O>> = BTreeMap::new();
    let mut input_order = Vec::new();
    let mut outputs: Vec<(usize, String, (usize, u32))> = Vec::new();
    let (mut opened, mut closed) = (false, false);
    for (ln, raw) in text.lines().enumerate() {
        let line = ln + 1;
        let err = |msg: String| IrError::Parse { line, msg };
        let t = raw.trim();
        if t.is_empty() || t.starts_with(';') || t.starts_with('#') {
            continue;
        }
        if closed {
            return Err(err("text after the closing '}'".into()));
        }
        let mut c = Cursor { toks: lex(t).map_err(err)?, pos: 0 };
        match c.peek() {
            Some(Tok::Ident(k)) if k == "graph" => {
                if opened {
                    return Err(err("a second 'graph {'".into()));
                }
                c.pos += 1;
                c.expect('{').and_then(|_| c.done()).map_err(err)?;
                opened = true;
                continue;
            }
            _ if !opened => return Err(err("expected 'graph {'".into())),
            Some(Tok::Punct('}')) => {
                c.pos += 1;
                c.done().map_err(err)?;
                closed = true;
            }
            Some(Tok::Ident(k)) if k == "output" => {
                c.pos += 1;
                let parsed = (|| {
                    let name = match c.next()? {
                        Tok::Str(s) => s,
                        t => return Err(format!("expected the output's name, found {t:?}")),
                    };
                    c.expect('=')?;
                    let v = match c.next()? {
                        Tok::Value(n, s) => (n, s),
                        t => return Err(format!("expected a value, found {t:?}")),
                    };
                    c.done()?;
                    Ok((name, v))
                })()
                .map_err(err)?;
                outputs.push((line, parsed.0, parsed.1));
            }
            Some(Tok::Value(n, 0)) => {
                let n = *n;
                c.pos += 1;
                let stmt: Stmt<O> = parse_node(&mut c, line).map_err(err)?;
                if stmt.op.is_input() {
                    input_order.push(n);
                }
                if stmts.insert(n, stmt).is_some() {
                    return Err(err(format!("%{n} defined twice")));
                }
            }
            _ => return Err(err("expected a node, an output or '}'".into())),
        }
    }
    if !opened {
        return Err(IrError::Parse { line: 1, msg: "empty file: expected 'graph {'".into() });
    }
    if !closed {
        return Err(IrError::Parse { line: text.lines().count(), msg: "missing closing '}'".into() });
    }
    build(stmts, input_order, outputs)
}

fn parse_node<O: OpSet>(c: &mut Cursor, line: usize) -> Result<Stmt<O>, String> {
    let name = match c.peek() {
        Some(Tok::Str(s)) => {
            let s = s.clone();
            c.pos += 1;
            s
        }
        _ => String::new(),
    };
    c.expect('=')?;
    let opname = c.ident()?;
    let mut inputs = Vec::new();
    if c.eat('(') {
        while !c.eat(')') {
            if !inputs.is_empty() {
                c.expect(',')?;
            }
            match c.next()? {
                Tok::Value(n, s) => inputs.push((n, s)),
                t => return Err(format!("expected an input value, found {t:?}")),
            }
        }
    }
    let mut attrs = BTreeMap::new();
    if c.eat('{') {
        while !c.eat('}') {
            if !attrs.is_empty() {
                c.expect(',')?;
            }
            let k = c.ident()?;
            c.expect('=')?;
            let v = c.attr()?;
            if attrs.insert(k.clone(), v).is_some() {
                return Err(format!("attribute {k} given twice"));
            }
        }
    }
    let op = O::from_attrs(&opname, Attrs(attrs))?;
    c.expect(':')?;
    let mut outputs = vec![c.ty()?];
    while c.eat(',') {
        outputs.push(c.ty()?);
    }
    let values = if c.eat('=') { Some(c.num_list()?) } else { None };
    c.done()?;
    if values.is_some() && !op.is_persistent() {
        return Err("only constants, parameters and state take values".into());
    }
    if (op.is_input() || op.is_persistent()) && name.is_empty() {
        return Err(format!("{opname} needs a name"));
    }
    Ok(Stmt { line, name, op, inputs, outputs, values })
}

/// The line of the last statement (where a missing output is reported).
fn text_end<O: OpSet>(stmts: &BTreeMap<usize, Stmt<O>>) -> usize {
    stmts.values().map(|s| s.line).max().unwrap_or(1)
}

fn build<O: OpSet>(
    stmts: BTreeMap<usize, Stmt<O>>,
    input_order: Vec<usize>,
    outputs: Vec<(usize, String, (usize, u32))>,
) -> Result<Graph<O>, IrError> {
    let mut g = Graph::new();
    let max = stmts.keys().next_back().copied();
    if max.is_some_and(|m| m > stmts.len() * 4 + 1024) {
        return Err(IrError::Parse { line: 1, msg: "node numbers are too sparse".into() });
    }
    // Create nodes so that %N gets index N: placeholders fill the gaps and
    // are removed once every node exists.
    let mut ids: HashMap<usize, NodeId> = HashMap::new();
    let mut holes = Vec::new();
    for n in 0..=max.unwrap_or(0) {
        match stmts.get(&n) {
            Some(s) => {
                ids.insert(
                    n,
                    g.add_raw(Node {
                        op: s.op.clone(),
                        name: s.name.clone(),
                        outputs: s.outputs.clone(),
                        origin: Vec::new(),
                        recomputes: None,
                    }),
                );
            }
            None if max.is_some() => holes.push(g.add_raw(Node {
                op: O::from_op(Op::Identity),
                name: String::new(),
                outputs: vec![],
                origin: Vec::new(),
                recomputes: None,
            })),
            None => {}
        }
    }
    let value = |line: usize, (n, s): (usize, u32)| -> Result<ValueId, IrError> {
        let node = *ids.get(&n).ok_or(IrError::Parse { line, msg: format!("%{n} is not defined") })?;
        Ok(ValueId { node, slot: s })
    };
    for (&n, s) in &stmts {
        for (port, &v) in s.inputs.iter().enumerate() {
            let v = value(s.line, v)?;
            g.connect(v, ids[&n], port as u32);
        }
        if let Some(vals) = &s.values {
            let t = values_tensor(&s.outputs[0], vals).map_err(|msg| IrError::Parse { line: s.line, msg })?;
            g.set_weight(ids[&n], t)?;
        }
    }
    for h in holes {
        g.remove_raw(h);
    }
    let mut names = std::collections::HashSet::new();
    for n in input_order {
        if !names.insert(&stmts[&n].name) {
            return Err(IrError::Parse { line: stmts[&n].line, msg: format!("two inputs are named {:?}", stmts[&n].name) });
        }
        g.push_input(ids[&n]);
    }
    if outputs.is_empty() {
        return Err(IrError::Parse { line: text_end(&stmts), msg: "the graph has no outputs (add `output \"NAME\" = %N`)".into() });
    }
    let mut names = std::collections::HashSet::new();
    for (line, name, v) in outputs {
        if !names.insert(name.clone()) {
            return Err(IrError::Parse { line, msg: format!("two outputs are named {name:?}") });
        }
        let v = value(line, v)?;
        g.add_output(name, v);
    }
    crate::verify::verify(&g)?;
    Ok(g)
}
