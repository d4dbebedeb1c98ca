//! Built-in models with deterministic random weights: they run with no
//! files. `zoo:resnet50` is smelt's embedded default. The transformers
//! (`bert_base`, `bert_large`, `gpt2`) take a sequence length and hold
//! their weights by reference: planning BERT-large allocates none of its
//! 1.3 GB, and the commands that need values fill them from their names.
//! The Llama-shaped decoders (`llama2_7b`, `llama3_8b`) are shapes only:
//! for inspecting, planning, compiling and fitting at the scale people
//! train; their billions of weights are never filled.

use crate::builder::{Builder, Res};
use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::{Graph, ValueId};
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::tensor::Tensor;

/// The names of the built-in models.
pub const NAMES: [&str; 8] = ["resnet50", "mobilenet_v2", "resnet8", "bert_base", "bert_large", "gpt2", "llama2_7b", "llama3_8b"];

/// The sequence length of the transformers when none is given.
pub const DEFAULT_SEQUENCE: usize = 128;

/// The built-in model `name` at batch size `batch`.
pub fn get(name: &str, batch: usize) -> Result<Graph, IrError> {
    get_sized(name, batch, None)
}

/// Whether `name` takes a sequence length (`--dim sequence=N`).
pub fn takes_sequence(name: &str) -> bool {
    matches!(name, "bert_base" | "bert_large" | "gpt2" | "llama2_7b" | "llama3_8b")
}

/// Whether `name` is shapes only: its weights are never filled, so it can
/// be inspected, planned, compiled and fitted, not run or trained.
pub fn shapes_only(name: &str) -> bool {
    matches!(name, "llama2_7b" | "llama3_8b")
}

/// The built-in model `name` at batch size `batch` and, for the
/// transformers, sequence length `sequence` (default [`DEFAULT_SEQUENCE`]).
pub fn get_sized(name: &str, batch: usize, sequence: Option<usize>) -> Result<Graph, IrError> {
    let seq = sequence.unwrap_or(DEFAULT_SEQUENCE);
    match name {
        "resnet50" => resnet50(batch),
        "mobilenet_v2" => mobilenet_v2(batch),
        "resnet8" => resnet8(batch),
        "bert_base" => bert(&Transformer::BERT_BASE, batch, seq),
        "bert_large" => bert(&Transformer::BERT_LARGE, batch, seq),
        "gpt2" => gpt2(&Transformer::GPT2, batch, seq),
        "llama2_7b" => llama(&Llama::LLAMA2_7B, batch, seq),
        "llama3_8b" => llama(&Llama::LLAMA3_8B, batch, seq),
        _ => Err(IrError::UnknownModel { name: name.to_string(), known: NAMES.join(", ") }),
    }
}

/// The sizes of a transformer.
#[derive(Clone, Copy, Debug)]
pub struct Transformer {
    /// Layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Longest sequence (position embeddings).
    pub positions: usize,
}

impl Transformer {
    /// BERT-base: 12 layers, hidden 768, 12 heads.
    pub const BERT_BASE: Transformer = Transformer { layers: 12, hidden: 768, heads: 12, ffn: 3072, vocab: 30522, positions: 512 };
    /// BERT-large: 24 layers, hidden 1024, 16 heads.
    pub const BERT_LARGE: Transformer = Transformer { layers: 24, hidden: 1024, heads: 16, ffn: 4096, vocab: 30522, positions: 512 };
    /// GPT-2 small: 12 layers, hidden 768, 12 heads, causal.
    pub const GPT2: Transformer = Transformer { layers: 12, hidden: 768, heads: 12, ffn: 3072, vocab: 50257, positions: 1024 };
}

/// Weights by reference, named per layer as Hugging Face names them.
struct Weights<'a> {
    g: &'a mut Builder,
}

impl Weights<'_> {
    fn get(&mut self, name: String, shape: &[usize]) -> ValueId {
        self.g.weight_ref(name, TensorType::new(DType::F32, shape.to_vec()))
    }
    /// `x [n, k] @ w [k, out] + b`, one GEMM with its bias.
    fn linear(&mut self, name: &str, x: ValueId, out: usize) -> Res {
        let k = self.g.ty(x).shape[1];
        let w = self.get(format!("{name}.weight"), &[out, k]);
        let b = self.get(format!("{name}.bias"), &[out]);
        self.g.op(Op::Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0 }, &[x, w, b])
    }
    fn layer_norm(&mut self, name: &str, x: ValueId) -> Res {
        let shape = &self.g.ty(x).shape;
        let (axis, h) = (shape.len() - 1, shape[shape.len() - 1]);
        let s = self.get(format!("{name}.weight"), &[h]);
        let b = self.get(format!("{name}.bias"), &[h]);
        self.g.op(Op::LayerNorm { axis, epsilon: 1e-5 }, &[x, s, b])
    }
}

/// Multi-head attention of `x [b*s, hidden]`: `mask` is added to the
/// scores (`[b or 1, 1, s or 1, s]`). Returns `[b*s, hidden]` before the
/// output projection.
fn attention(w: &mut Weights, t: &Transformer, name: &str, x: ValueId, mask: ValueId, (b, s): (usize, usize)) -> Res {
    let (nh, hd) = (t.heads, t.hidden / t.heads);
    let heads = |w: &mut Weights, which: &str, perm: Vec<usize>| -> Res {
        let y = w.linear(&format!("{name}.{which}"), x, t.hidden)?;
        let y = w.g.op(Op::Reshape { shape: vec![b, s, nh, hd] }, &[y])?;
        w.g.op(Op::Transpose { perm }, &[y])
    };
    let q = heads(w, "query", vec![0, 2, 1, 3])?;
    let kt = heads(w, "key", vec![0, 2, 3, 1])?;
    let v = heads(w, "value", vec![0, 2, 1, 3])?;
    let scores = w.g.op(Op::MatMul, &[q, kt])?;
    let scale = w.g.constant(format!("{name}.scale"), Tensor::from_f32(vec![], vec![1.0 / (hd as f32).sqrt()]));
    let scores = w.g.op(Op::Binary(BinaryOp::Mul), &[scores, scale])?;
    let scores = w.g.op(Op::Binary(BinaryOp::Add), &[scores, mask])?;
    let p = w.g.softmax(scores)?;
    let o = w.g.op(Op::MatMul, &[p, v])?;
    let o = w.g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[o])?;
    w.g.op(Op::Reshape { shape: vec![b * s, t.hidden] }, &[o])
}

/// Token and position embeddings of `ids [b, s]`: `[b*s, hidden]`.
fn embeddings(w: &mut Weights, t: &Transformer, (word, pos): (&str, &str), ids: ValueId, (b, s): (usize, usize)) -> Res {
    let table = w.get(format!("{word}.weight"), &[t.vocab, t.hidden]);
    let x = w.g.op(Op::Gather { axis: 0 }, &[table, ids])?;
    let positions = w.get(format!("{pos}.weight"), &[t.positions, t.hidden]);
    let p = w.g.op(Op::Slice { axes: vec![0], starts: vec![0], ends: vec![s as i64], steps: vec![1] }, &[positions])?;
    let x = w.g.op(Op::Binary(BinaryOp::Add), &[x, p])?;
    w.g.op(Op::Reshape { shape: vec![b * s, t.hidden] }, &[x])
}

fn check_sequence(t: &Transformer, s: usize) -> Result<(), IrError> {
    if s == 0 || s > t.positions {
        return Err(IrError::Usage(format!("--dim sequence={s}: this model takes sequences of 1 to {} tokens", t.positions)));
    }
    Ok(())
}

/// BERT (post-norm encoder) with its padding mask: inputs `input_ids` and
/// `attention_mask` (i64 `[batch, sequence]`), output the last hidden state.
pub fn bert(t: &Transformer, batch: usize, seq: usize) -> Result<Graph, IrError> {
    check_sequence(t, seq)?;
    let mut g = Builder::new(7);
    let ids = g.input_typed("input_ids", TensorType::new(DType::I64, vec![batch, seq]))?;
    let mask = g.input_typed("attention_mask", TensorType::new(DType::I64, vec![batch, seq]))?;
    let w = &mut Weights { g: &mut g };
    let bs = (batch, seq);
    let x = embeddings(w, t, ("embeddings.word_embeddings", "embeddings.position_embeddings"), ids, bs)?;
    let mut x = w.layer_norm("embeddings.LayerNorm", x)?;
    // (1 - mask) * -10000, broadcast over heads and queries.
    let m = w.g.op(Op::Cast { to: DType::F32 }, &[mask])?;
    let one = w.g.constant("mask.one".into(), Tensor::from_f32(vec![], vec![1.0]));
    let big = w.g.constant("mask.min".into(), Tensor::from_f32(vec![], vec![-10000.0]));
    let m = w.g.op(Op::Binary(BinaryOp::Sub), &[one, m])?;
    let m = w.g.op(Op::Binary(BinaryOp::Mul), &[m, big])?;
    let m = w.g.op(Op::Reshape { shape: vec![batch, 1, 1, seq] }, &[m])?;
    for l in 0..t.layers {
        let name = format!("encoder.layer.{l}");
        let a = attention(w, t, &format!("{name}.attention.self"), x, m, bs)?;
        let a = w.linear(&format!("{name}.attention.output.dense"), a, t.hidden)?;
        let a = w.g.add(a, x)?;
        x = w.layer_norm(&format!("{name}.attention.output.LayerNorm"), a)?;
        let f = w.linear(&format!("{name}.intermediate.dense"), x, t.ffn)?;
        let f = w.g.op(Op::Unary(UnaryOp::Gelu), &[f])?;
        let f = w.linear(&format!("{name}.output.dense"), f, t.hidden)?;
        let f = w.g.add(f, x)?;
        x = w.layer_norm(&format!("{name}.output.LayerNorm"), f)?;
    }
    let y = g.op(Op::Reshape { shape: vec![batch, seq, t.hidden] }, &[x])?;
    g.finish("last_hidden_state", y)
}

/// GPT-2 (pre-norm decoder, causal): input `input_ids` (i64 `[batch,
/// sequence]`), output the last hidden state.
pub fn gpt2(t: &Transformer, batch: usize, seq: usize) -> Result<Graph, IrError> {
    check_sequence(t, seq)?;
    let mut g = Builder::new(8);
    let ids = g.input_typed("input_ids", TensorType::new(DType::I64, vec![batch, seq]))?;
    // Query i sees keys j <= i: -1e9 above the diagonal.
    let causal: Vec<f32> = (0..seq * seq).map(|p| if p % seq > p / seq { -1e9 } else { 0.0 }).collect();
    let mask = g.constant("causal_mask".into(), Tensor::from_f32(vec![1, 1, seq, seq], causal));
    let w = &mut Weights { g: &mut g };
    let bs = (batch, seq);
    let mut x = embeddings(w, t, ("wte", "wpe"), ids, bs)?;
    for l in 0..t.layers {
        let name = format!("h.{l}");
        let h = w.layer_norm(&format!("{name}.ln_1"), x)?;
        let a = attention(w, t, &format!("{name}.attn"), h, mask, bs)?;
        let a = w.linear(&format!("{name}.attn.c_proj"), a, t.hidden)?;
        x = w.g.add(x, a)?;
        let h = w.layer_norm(&format!("{name}.ln_2"), x)?;
        let f = w.linear(&format!("{name}.mlp.c_fc"), h, t.ffn)?;
        let f = w.g.op(Op::Unary(UnaryOp::GeluTanh), &[f])?;
        let f = w.linear(&format!("{name}.mlp.c_proj"), f, t.hidden)?;
        x = w.g.add(x, f)?;
    }
    let x = w.layer_norm("ln_f", x)?;
    let y = g.op(Op::Reshape { shape: vec![batch, seq, t.hidden] }, &[x])?;
    g.finish("last_hidden_state", y)
}

/// The sizes of a Llama-style decoder (Hugging Face's `LlamaConfig`).
#[derive(Clone, Copy, Debug)]
pub struct Llama {
    /// Layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (fewer than `heads`: grouped-query attention).
    pub kv_heads: usize,
    /// The SwiGLU feed-forward's inner size.
    pub ffn: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Longest sequence.
    pub positions: usize,
    /// RMSNorm's epsilon.
    pub eps: f32,
}

impl Llama {
    /// Llama-2-7B: 32 layers, hidden 4096, 32 heads, feed-forward 11008.
    pub const LLAMA2_7B: Llama =
        Llama { layers: 32, hidden: 4096, heads: 32, kv_heads: 32, ffn: 11008, vocab: 32000, positions: 4096, eps: 1e-5 };
    /// Llama-3-8B: as Llama-2-7B with 8 key-value heads, feed-forward
    /// 14336 and a 128256-token vocabulary.
    pub const LLAMA3_8B: Llama =
        Llama { layers: 32, hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, vocab: 128256, positions: 8192, eps: 1e-5 };
}

impl Weights<'_> {
    /// `x [n, k] @ w [out, k]ᵀ`, without bias (Llama's projections).
    fn proj(&mut self, name: &str, x: ValueId, out: usize) -> Res {
        let k = self.g.ty(x).shape[1];
        let w = self.get(format!("{name}.weight"), &[out, k]);
        self.g.op(Op::Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0 }, &[x, w])
    }

    /// RMSNorm of `x [n, h]`: `x / sqrt(mean(x²) + eps) * weight`.
    fn rms_norm(&mut self, name: &str, x: ValueId, eps: f32) -> Res {
        let h = self.g.ty(x).shape[1];
        let sq = self.g.op(Op::Binary(BinaryOp::Mul), &[x, x])?;
        let ms = self.g.op(Op::Reduce { op: crate::op::ReduceOp::Mean, axes: vec![1], keepdims: true }, &[sq])?;
        let e = self.g.constant(format!("{name}.eps"), Tensor::from_f32(vec![], vec![eps]));
        let ms = self.g.op(Op::Binary(BinaryOp::Add), &[ms, e])?;
        let rms = self.g.op(Op::Unary(UnaryOp::Sqrt), &[ms])?;
        let inv = self.g.op(Op::Unary(UnaryOp::Reciprocal), &[rms])?;
        let y = self.g.op(Op::Binary(BinaryOp::Mul), &[x, inv])?;
        let w = self.get(format!("{name}.weight"), &[h]);
        self.g.op(Op::Binary(BinaryOp::Mul), &[y, w])
    }

    /// Rotary position embedding of `x [b, s, heads, hd]`:
    /// `x * cos + rotate_half(x) * sin`, as Hugging Face's Llama.
    fn rotary(&mut self, x: ValueId, (cos, sin): (ValueId, ValueId)) -> Res {
        let hd = self.g.ty(x).shape[3];
        let half = |w: &mut Self, from: usize, to: usize| {
            w.g.op(Op::Slice { axes: vec![3], starts: vec![from as i64], ends: vec![to as i64], steps: vec![1] }, &[x])
        };
        let (lo, hi) = (half(self, 0, hd / 2)?, half(self, hd / 2, hd)?);
        let hi = self.g.op(Op::Unary(UnaryOp::Neg), &[hi])?;
        let rotated = self.g.op(Op::Concat { axis: 3 }, &[hi, lo])?;
        let a = self.g.op(Op::Binary(BinaryOp::Mul), &[x, cos])?;
        let b = self.g.op(Op::Binary(BinaryOp::Mul), &[rotated, sin])?;
        self.g.op(Op::Binary(BinaryOp::Add), &[a, b])
    }
}

/// A Llama-style decoder (pre-RMSNorm, rotary embeddings, grouped-query
/// causal attention, SwiGLU, untied LM head), shapes only: input
/// `input_ids` (i64 `[batch, sequence]`), output `logits` `[batch,
/// sequence, vocab]`. Every weight, the rotary tables and the causal mask
/// are held by reference under Hugging Face's names.
pub fn llama(t: &Llama, batch: usize, seq: usize) -> Result<Graph, IrError> {
    if seq == 0 || seq > t.positions {
        return Err(IrError::Usage(format!("--dim sequence={seq}: this model takes sequences of 1 to {} tokens", t.positions)));
    }
    let (nh, kvh, hd) = (t.heads, t.kv_heads, t.hidden / t.heads);
    let mut g = Builder::new(9);
    let ids = g.input_typed("input_ids", TensorType::new(DType::I64, vec![batch, seq]))?;
    let w = &mut Weights { g: &mut g };
    let rope =
        (w.get("model.rotary_emb.cos_cached".into(), &[1, seq, 1, hd]), w.get("model.rotary_emb.sin_cached".into(), &[1, seq, 1, hd]));
    let mask = w.get("model.causal_mask".into(), &[1, 1, seq, seq]);
    let scale = w.g.constant("model.attention_scale".into(), Tensor::from_f32(vec![], vec![1.0 / (hd as f32).sqrt()]));
    let table = w.get("model.embed_tokens.weight".into(), &[t.vocab, t.hidden]);
    let x = w.g.op(Op::Gather { axis: 0 }, &[table, ids])?;
    let mut x = w.g.op(Op::Reshape { shape: vec![batch * seq, t.hidden] }, &[x])?;
    for l in 0..t.layers {
        let name = format!("model.layers.{l}");
        let h = w.rms_norm(&format!("{name}.input_layernorm"), x, t.eps)?;
        // Queries, keys and values as [b, s, heads, hd], rotated; the
        // key-value heads repeated over their groups of query heads.
        let heads = |w: &mut Weights, which: &str, n: usize, rotate: bool| -> Res {
            let y = w.proj(&format!("{name}.self_attn.{which}_proj"), h, n * hd)?;
            let y = w.g.op(Op::Reshape { shape: vec![batch, seq, n, hd] }, &[y])?;
            let y = if rotate { w.rotary(y, rope)? } else { y };
            if n == nh {
                return Ok(y);
            }
            let y = w.g.op(Op::Reshape { shape: vec![batch, seq, n, 1, hd] }, &[y])?;
            let y = w.g.op(Op::Expand { shape: vec![batch, seq, n, nh / n, hd] }, &[y])?;
            w.g.op(Op::Reshape { shape: vec![batch, seq, nh, hd] }, &[y])
        };
        let q = heads(w, "q", nh, true)?;
        let q = w.g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[q])?;
        let k = heads(w, "k", kvh, true)?;
        let kt = w.g.op(Op::Transpose { perm: vec![0, 2, 3, 1] }, &[k])?;
        let v = heads(w, "v", kvh, false)?;
        let v = w.g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[v])?;
        let scores = w.g.op(Op::MatMul, &[q, kt])?;
        let scores = w.g.op(Op::Binary(BinaryOp::Mul), &[scores, scale])?;
        let scores = w.g.op(Op::Binary(BinaryOp::Add), &[scores, mask])?;
        let p = w.g.softmax(scores)?;
        let o = w.g.op(Op::MatMul, &[p, v])?;
        let o = w.g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[o])?;
        let o = w.g.op(Op::Reshape { shape: vec![batch * seq, t.hidden] }, &[o])?;
        let o = w.proj(&format!("{name}.self_attn.o_proj"), o, t.hidden)?;
        x = w.g.add(x, o)?;
        // SwiGLU: down(silu(gate(h)) * up(h)).
        let h = w.rms_norm(&format!("{name}.post_attention_layernorm"), x, t.eps)?;
        let gate = w.proj(&format!("{name}.mlp.gate_proj"), h, t.ffn)?;
        let sig = w.g.op(Op::Unary(UnaryOp::Sigmoid), &[gate])?;
        let silu = w.g.op(Op::Binary(BinaryOp::Mul), &[gate, sig])?;
        let up = w.proj(&format!("{name}.mlp.up_proj"), h, t.ffn)?;
        let f = w.g.op(Op::Binary(BinaryOp::Mul), &[silu, up])?;
        let f = w.proj(&format!("{name}.mlp.down_proj"), f, t.hidden)?;
        x = w.g.add(x, f)?;
    }
    let x = w.rms_norm("model.norm", x, t.eps)?;
    let logits = w.proj("lm_head", x, t.vocab)?;
    let y = g.op(Op::Reshape { shape: vec![batch, seq, t.vocab] }, &[logits])?;
    g.finish("logits", y)
}

/// ResNet-50 v1.5 (stride on the 3x3 conv), ImageNet shapes.
pub fn resnet50(batch: usize) -> Result<Graph, IrError> {
    let mut b = Builder::new(50);
    let x = b.input("data", &[batch, 3, 224, 224])?;
    let mut x = conv_bn(&mut b, x, 64, 7, 2, 3, true)?;
    x = b.max_pool(x, 3, 2, 1)?;
    for (stage, (&blocks, &width)) in [3, 4, 6, 3].iter().zip(&[64, 128, 256, 512]).enumerate() {
        for i in 0..blocks {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            x = bottleneck(&mut b, x, width, stride)?;
        }
    }
    let x = b.pool_flatten(x)?;
    let x = b.linear(x, 1000)?;
    let x = b.softmax(x)?;
    b.finish("prob", x)
}

/// ResNet-8 for CIFAR-10 shapes (He et al. 2016, n = 1): a 3x3 stem and
/// three basic blocks of 16, 32 and 64 channels on 32x32 images, ten
/// classes. Small enough to train on a CPU in seconds (`smelt train`'s
/// demonstration).
pub fn resnet8(batch: usize) -> Result<Graph, IrError> {
    let mut b = Builder::new(8);
    let x = b.input("data", &[batch, 3, 32, 32])?;
    let mut x = conv_bn(&mut b, x, 16, 3, 1, 1, true)?;
    for (i, &width) in [16, 32, 64].iter().enumerate() {
        x = basic_block(&mut b, x, width, if i == 0 { 1 } else { 2 })?;
    }
    let x = b.pool_flatten(x)?;
    let x = b.linear(x, 10)?;
    let x = b.softmax(x)?;
    b.finish("prob", x)
}

fn basic_block(b: &mut Builder, x: ValueId, width: usize, stride: usize) -> Res {
    let cin = b.ty(x).shape[1];
    let y = conv_bn(b, x, width, 3, stride, 1, true)?;
    let y = b.conv(y, width, 3, 1, 1)?;
    let y = b.batch_norm(y, 0.2)?;
    let skip = if stride != 1 || cin != width { conv_bn(b, x, width, 1, stride, 0, false)? } else { x };
    let y = b.add(y, skip)?;
    b.relu(y)
}

fn conv_bn(b: &mut Builder, x: ValueId, out: usize, k: usize, stride: usize, pad: usize, relu: bool) -> Res {
    let y = b.conv(x, out, k, stride, pad)?;
    let y = b.batch_norm(y, 1.0)?;
    if relu {
        b.relu(y)
    } else {
        Ok(y)
    }
}

fn bottleneck(b: &mut Builder, x: ValueId, width: usize, stride: usize) -> Res {
    let cin = b.ty(x).shape[1];
    let y = conv_bn(b, x, width, 1, 1, 0, true)?;
    let y = conv_bn(b, y, width, 3, stride, 1, true)?;
    let y = b.conv(y, width * 4, 1, 1, 0)?;
    let y = b.batch_norm(y, 0.2)?;
    let skip = if stride != 1 || cin != width * 4 { conv_bn(b, x, width * 4, 1, stride, 0, false)? } else { x };
    let y = b.add(y, skip)?;
    b.relu(y)
}

/// MobileNetV2 (width 1.0), ImageNet shapes: inverted residuals with
/// depthwise 3x3 convolutions and ReLU6.
pub fn mobilenet_v2(batch: usize) -> Result<Graph, IrError> {
    let mut b = Builder::new(2);
    let x = b.input("data", &[batch, 3, 224, 224])?;
    let y = b.conv(x, 32, 3, 2, 1)?;
    let y = b.batch_norm(y, 1.0)?;
    let mut x = b.relu6(y)?;
    for &(t, c, n, s) in &[(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)] {
        for i in 0..n {
            x = inverted_residual(&mut b, x, t, c, if i == 0 { s } else { 1 })?;
        }
    }
    let y = b.conv(x, 1280, 1, 1, 0)?;
    let y = b.batch_norm(y, 1.0)?;
    let y = b.relu6(y)?;
    let y = b.pool_flatten(y)?;
    let y = b.linear(y, 1000)?;
    let y = b.softmax(y)?;
    b.finish("prob", y)
}

fn inverted_residual(b: &mut Builder, x: ValueId, expand: usize, out: usize, stride: usize) -> Res {
    let cin = b.ty(x).shape[1];
    let hidden = cin * expand;
    let mut y = x;
    if expand != 1 {
        y = b.conv(y, hidden, 1, 1, 0)?;
        y = b.batch_norm(y, 1.0)?;
        y = b.relu6(y)?;
    }
    y = b.conv_g(y, hidden, 3, stride, 1, hidden)?;
    y = b.batch_norm(y, 1.0)?;
    y = b.relu6(y)?;
    y = b.conv(y, out, 1, 1, 0)?;
    let residual = stride == 1 && cin == out;
    y = b.batch_norm(y, if residual { 0.2 } else { 1.0 })?;
    if residual {
        y = b.add(y, x)?;
    }
    Ok(y)
}
