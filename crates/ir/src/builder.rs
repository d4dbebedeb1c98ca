//! A concise way to write models in Rust. Weights are deterministic random
//! values (He initialisation) from a seeded [`Rng`], so a built model runs
//! with no files; names are generated (`conv3`, `conv3.w`).

use crate::dtype::{DType, TensorType};
use crate::error::IrError;
use crate::graph::{Graph, ValueId};
use crate::op::{BinaryOp, Conv, Op, Pool, UnaryOp};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// Builds a [`Graph`] layer by layer.
pub struct Builder {
    g: Graph,
    rng: Rng,
    count: usize,
}

/// Result of a builder step.
pub type Res = Result<ValueId, IrError>;

impl Builder {
    /// A builder whose weights come from `seed`.
    pub fn new(seed: u64) -> Builder {
        Builder { g: Graph::new(), rng: Rng::new(seed), count: 0 }
    }

    fn fresh(&mut self, what: &str) -> String {
        self.count += 1;
        format!("{what}{}", self.count)
    }

    /// A new f32 graph input.
    pub fn input(&mut self, name: &str, shape: &[usize]) -> Res {
        self.g.add_input(name, TensorType::new(DType::F32, shape))
    }

    /// A new graph input of any type.
    pub fn input_typed(&mut self, name: &str, ty: TensorType) -> Res {
        self.g.add_input(name, ty)
    }

    /// A constant holding `data`.
    pub fn constant(&mut self, name: String, data: Tensor) -> ValueId {
        self.g.add_constant(name, data)
    }

    /// A constant known by name and type only: the commands that need values
    /// fill it (`Session::fill_weights`), the others never allocate it.
    pub fn weight_ref(&mut self, name: String, ty: TensorType) -> ValueId {
        self.g.add_weight_ref(name, ty)
    }

    /// A constant of `shape` whose elements are `f(rng)`.
    pub fn weight(&mut self, name: String, shape: &[usize], mut f: impl FnMut(&mut Rng) -> f32) -> ValueId {
        let data = (0..shape.iter().product::<usize>()).map(|_| f(&mut self.rng)).collect();
        self.g.add_constant(name, Tensor::from_f32(shape, data))
    }

    /// Any op on any inputs, with a generated name.
    pub fn op(&mut self, op: Op, inputs: &[ValueId]) -> Res {
        let name = self.fresh(op.name());
        let id = self.g.add(op, name, inputs)?;
        Ok(ValueId { node: id, slot: 0 })
    }

    /// A square `k`x`k` convolution without bias, `groups` groups.
    pub fn conv_g(&mut self, x: ValueId, out: usize, k: usize, stride: usize, pad: usize, groups: usize) -> Res {
        let cin = *self.g.ty(x).shape.get(1).unwrap_or(&0) / groups.max(1);
        let name = self.fresh("conv");
        let std = (2.0 / (cin * k * k).max(1) as f32).sqrt();
        let w = self.weight(format!("{name}.w"), &[out, cin, k, k], |r| r.normal() * std);
        let op = Op::Conv(Conv { strides: vec![stride; 2], pads: vec![pad; 4], dilations: vec![1; 2], group: groups });
        let id = self.g.add(op, name, &[x, w])?;
        Ok(ValueId { node: id, slot: 0 })
    }

    /// A dense square convolution without bias.
    pub fn conv(&mut self, x: ValueId, out: usize, k: usize, stride: usize, pad: usize) -> Res {
        self.conv_g(x, out, k, stride, pad, 1)
    }

    /// Batch normalization with random statistics; `gain` scales its
    /// learned scale (a small gain on a residual branch keeps deep nets stable).
    pub fn batch_norm(&mut self, x: ValueId, gain: f32) -> Res {
        let c = *self.g.ty(x).shape.get(1).unwrap_or(&0);
        let name = self.fresh("bn");
        let s = self.weight(format!("{name}.scale"), &[c], |r| gain * (0.8 + 0.4 * r.uniform()));
        let b = self.weight(format!("{name}.bias"), &[c], |r| 0.05 * r.normal());
        let m = self.weight(format!("{name}.mean"), &[c], |r| 0.05 * r.normal());
        let v = self.weight(format!("{name}.var"), &[c], |r| 0.5 + r.uniform());
        let id = self.g.add(Op::BatchNorm { epsilon: 1e-5 }, name, &[x, s, b, m, v])?;
        Ok(ValueId { node: id, slot: 0 })
    }

    /// max(x, 0).
    pub fn relu(&mut self, x: ValueId) -> Res {
        self.op(Op::Unary(UnaryOp::Relu), &[x])
    }

    /// min(max(x, 0), 6).
    pub fn relu6(&mut self, x: ValueId) -> Res {
        self.op(Op::Clip { min: 0.0, max: 6.0 }, &[x])
    }

    /// a + b with broadcasting.
    pub fn add(&mut self, a: ValueId, b: ValueId) -> Res {
        self.op(Op::Binary(BinaryOp::Add), &[a, b])
    }

    /// Square max pooling.
    pub fn max_pool(&mut self, x: ValueId, k: usize, stride: usize, pad: usize) -> Res {
        self.op(Op::MaxPool(Pool { kernel: vec![k; 2], strides: vec![stride; 2], pads: vec![pad; 4], ceil_mode: false }), &[x])
    }

    /// Global average pooling then flattening to `[N, C]`.
    pub fn pool_flatten(&mut self, x: ValueId) -> Res {
        let p = self.op(Op::GlobalAveragePool, &[x])?;
        self.op(Op::Flatten { axis: 1 }, &[p])
    }

    /// A fully connected layer (`Gemm` with a transposed weight and a bias).
    pub fn linear(&mut self, x: ValueId, out: usize) -> Res {
        let k = *self.g.ty(x).shape.last().unwrap_or(&0);
        let name = self.fresh("fc");
        let std = (2.0 / k.max(1) as f32).sqrt();
        let w = self.weight(format!("{name}.w"), &[out, k], |r| r.normal() * std);
        let b = self.weight(format!("{name}.b"), &[out], |r| 0.05 * r.normal());
        let id = self.g.add(Op::Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0 }, name, &[x, w, b])?;
        Ok(ValueId { node: id, slot: 0 })
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, x: ValueId) -> Res {
        let axis = self.g.ty(x).shape.len().saturating_sub(1);
        self.op(Op::Softmax { axis }, &[x])
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.g.ty(v)
    }

    /// Marks `v` as an output and returns the verified graph.
    pub fn finish(mut self, output: &str, v: ValueId) -> Result<Graph, IrError> {
        self.g.add_output(output, v);
        crate::verify::verify(&self.g)?;
        Ok(self.g)
    }
}
