//! Fused attention as data, in the style of FlashAttention: one thread per
//! query row, the keys and values staged through shared memory a tile at a
//! time, the softmax computed online in f32 registers (running maximum and
//! sum, the accumulator rescaled as the maximum grows), so the scores
//! `[.., queries, keys]` never exist in memory. The scores' prologue (scale,
//! additive masks) is evaluated per score from its operands' broadcast
//! strides. The same description renders to CUDA C and runs on the CPU in
//! the kernel's order of operations.

use crate::elementwise::{expr_body, strides};
use smelt_ir::kernel_op::{ATTENTION_MAX_BATCH, ATTENTION_MAX_HEAD};
use smelt_ir::{DType, Expr, KernelGraph, KernelOp, NodeId, Tensor};

/// Query rows per block (one thread each).
pub const ROWS: usize = 64;
/// Keys per shared-memory tile.
pub const KEYS: usize = 16;

/// A fused attention kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// A stable, readable name, e.g. `attention_2x4_q16k16d16`.
    pub name: String,
    /// The scores' prologue.
    pub expr: Expr,
    /// Which input of `expr` is the product q @ kt.
    pub score: usize,
    /// NaN rows (every key masked) give zeros.
    pub nan_to_zero: bool,
    /// The output's batch dims: one grid row of blocks per matrix.
    pub batch: Vec<usize>,
    /// Queries, keys, head dim of q and k, head dim of v.
    pub sq: usize,
    /// Keys.
    pub sk: usize,
    /// Head dim of q and k.
    pub d: usize,
    /// Head dim of v.
    pub dv: usize,
    /// Per batch dim, the element strides of q, kt and v (0 where broadcast).
    pub batch_strides: [Vec<usize>; 3],
    /// The element strides of q, kt and v along their last two dims as
    /// read (rows, columns): a folded transpose makes them other than dense.
    pub mat_strides: [(usize, usize); 3],
    /// The output's element strides along its logical dims (batch dims,
    /// queries, head dim) when it is written permuted; `None`: dense.
    pub out_strides: Option<Vec<usize>>,
    /// Dtypes of q, kt, v.
    pub dtypes: [DType; 3],
    /// The extras: dtype and element strides in the scores' index space.
    pub extras: Vec<(DType, Vec<usize>)>,
    /// The output dtype.
    pub out: DType,
    /// The output shape as stored.
    pub output: Vec<usize>,
}

impl Attention {
    /// The description of node `id`, if it is fused attention.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Attention> {
        let node = g.node(id);
        let KernelOp::Attention { expr, score, nan_to_zero, perms } = &node.op else { return None };
        let ins = g.inputs_of(id);
        let tys: Vec<&smelt_ir::TensorType> = ins.iter().map(|v| g.ty(*v)).collect();
        let (out, scores) = smelt_ir::attention_types(expr, *score, perms, &tys).ok()?;
        // Each operand as read: its shape and element strides after its permutation.
        let read: Vec<(smelt_ir::TensorType, Vec<usize>)> = (0..3)
            .map(|k| {
                let dense = crate::layout::row_strides(&tys[k].shape);
                match perms[k].as_slice() {
                    [] => (tys[k].clone(), dense),
                    p => (
                        smelt_ir::TensorType::new(tys[k].dtype, p.iter().map(|&i| tys[k].shape[i]).collect::<Vec<_>>()),
                        p.iter().map(|&i| dense[i]).collect(),
                    ),
                }
            })
            .collect();
        let (q, kt, v) = (&read[0].0, &read[1].0, &read[2].0);
        if tys.iter().any(|t| !t.dtype.is_float()) {
            return None;
        }
        let r = scores.shape.len();
        let (sq, sk) = (scores.shape[r - 2], scores.shape[r - 1]);
        let (d, dv) = (q.shape[q.shape.len() - 1], v.shape[v.shape.len() - 1]);
        // (d + dv) * KEYS floats of shared memory: 16 KiB at most.
        if d > ATTENTION_MAX_HEAD || dv > ATTENTION_MAX_HEAD {
            return None;
        }
        let batch = scores.shape[..r - 2].to_vec();
        if batch.iter().product::<usize>() > ATTENTION_MAX_BATCH {
            return None;
        }
        // Batch strides: the operand's own strides along its batch dims
        // (aligned to the output's from the right), 0 where it broadcasts.
        let bst = |(t, st): &(smelt_ir::TensorType, Vec<usize>)| -> Vec<usize> {
            let n = t.shape.len() - 2;
            (0..batch.len())
                .map(|d| match (d + n).checked_sub(batch.len()) {
                    Some(k) if t.shape[k] != 1 => st[k],
                    _ => 0,
                })
                .collect()
        };
        let mat = |(_, st): &(smelt_ir::TensorType, Vec<usize>)| (st[st.len() - 2], st[st.len() - 1]);
        let mat_strides = [mat(&read[0]), mat(&read[1]), mat(&read[2])];
        let extras = tys[3..].iter().map(|t| (t.dtype, strides(&t.shape, &scores.shape))).collect();
        let batch_strides = [bst(&read[0]), bst(&read[1]), bst(&read[2])];
        // Written permuted: logical dim perm[j] is stored dim j.
        let out_strides = (!perms[3].is_empty()).then(|| {
            let dense = crate::layout::row_strides(&out.shape);
            let mut st = vec![0; dense.len()];
            for (j, &p) in perms[3].iter().enumerate() {
                st[p] = dense[j];
            }
            st
        });
        let dims = batch.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        Some(Attention {
            name: format!("attention_{dims}_q{sq}k{sk}d{d}{suffix}"),
            expr: expr.clone(),
            score: *score,
            nan_to_zero: *nan_to_zero,
            batch,
            sq,
            sk,
            d,
            dv,
            batch_strides,
            mat_strides,
            out_strides,
            dtypes: [q.dtype, kt.dtype, v.dtype],
            extras,
            out: out.dtype,
            output: out.shape.clone(),
        })
    }

    /// Matrices (the grid's y extent).
    pub fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// Grid: (query tiles, matrices).
    pub fn grid(&self) -> [usize; 3] {
        [self.sq.div_ceil(ROWS).max(1), self.batches().max(1), 1]
    }

    /// Multiply-adds of both products.
    pub fn macs(&self) -> usize {
        self.batches() * self.sq * self.sk * (self.d + self.dv)
    }

    /// The scores' shape.
    fn scores(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.sq, self.sk]);
        s
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(q, kt, v, e0, ..., out)`.
    pub fn cuda(&self) -> String {
        let ty = |d: DType| crate::c_type(d).0;
        let load = |d: DType, x: String| match d {
            DType::F16 | DType::BF16 => format!("{}({x})", crate::c_type(d).1),
            _ => x,
        };
        let (sq, sk, d, dv) = (self.sq, self.sk, self.d, self.dv);
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s +=
            &format!(
            "// {}: softmax({} with $%{} = q @ kt) @ v over {:?}, {ROWS} query rows per block, {KEYS}-key tiles, online softmax in f32\n",
            self.name, self.expr, self.score, self.scores()
        );
        let extra_params: Vec<String> =
            self.extras.iter().enumerate().map(|(k, (dt, _))| format!("const {}* __restrict__ e{k}", ty(*dt))).collect();
        // The prologue at one score: its extras read at flat index f of the scores.
        let shape = self.scores();
        let mut pro = format!("__device__ __forceinline__ float prologue_{}(float s", self.name);
        for p in &extra_params {
            pro += &format!(", {p}");
        }
        pro += ", unsigned long long f) {\n";
        if !self.extras.is_empty() {
            pro += "    unsigned long long r = f;\n";
            for dd in (0..shape.len()).rev() {
                pro += &format!("    unsigned long long c{dd} = r % {}ull; r /= {}ull;\n", shape[dd], shape[dd]);
            }
        }
        for k in 0..=self.extras.len() {
            if k == self.score {
                pro += &format!("    float a{k} = s;\n");
            } else {
                let e = k - usize::from(k > self.score);
                let (dt, st) = &self.extras[e];
                let terms: Vec<String> = st.iter().enumerate().filter(|(_, &x)| x != 0).map(|(dd, &x)| format!("c{dd} * {x}ull")).collect();
                let at = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
                pro += &format!("    float a{k} = {};\n", load(*dt, format!("e{k2}[{at}]", k2 = e)));
            }
        }
        pro += &expr_body(&self.expr);
        pro += "}\n\n";
        s += &pro;
        let [tq, tk, tv] = self.dtypes.map(ty);
        let mut params =
            vec![format!("const {tq}* __restrict__ q"), format!("const {tk}* __restrict__ kt"), format!("const {tv}* __restrict__ v")];
        params.extend(extra_params.iter().cloned());
        params.push(format!("{}* __restrict__ out", ty(self.out)));
        s += &format!("extern \"C\" __global__ void {}({}) {{\n", self.name, params.join(", "));
        s += &format!("    __shared__ float ks[{d}][{KEYS}];\n    __shared__ float vs[{KEYS}][{dv}];\n");
        s += "    unsigned long long z = blockIdx.y, rem = z, qo = 0, ko = 0, vo = 0;\n";
        for b in (0..self.batch.len()).rev() {
            let [a, k, v] = [&self.batch_strides[0][b], &self.batch_strides[1][b], &self.batch_strides[2][b]];
            s += &format!(
                "    qo += (rem % {n}ull) * {a}ull; ko += (rem % {n}ull) * {k}ull; vo += (rem % {n}ull) * {v}ull; rem /= {n}ull;\n",
                n = self.batch[b]
            );
        }
        s += &format!("    int row = blockIdx.x * {ROWS} + threadIdx.x;\n    bool live = row < {sq};\n");
        let [(qr, qc), (kr, kc), (vr, vc)] = self.mat_strides;
        s += &format!(
            "    float qr[{d}];\n    for (int i = 0; i < {d}; ++i) qr[i] = live ? {} : 0.0f;\n",
            load(self.dtypes[0], format!("q[qo + (unsigned long long)row * {qr}ull + (unsigned long long)i * {qc}ull]"))
        );
        s += &format!("    float acc[{dv}];\n    for (int i = 0; i < {dv}; ++i) acc[i] = 0.0f;\n");
        s += "    float m = __int_as_float(0xff800000), l = 0.0f;\n";
        s += &format!("    for (int t = 0; t < {sk}; t += {KEYS}) {{\n");
        s += &format!(
            "        for (int e = threadIdx.x; e < {}; e += {ROWS}) {{ int i = e / {KEYS}, j = e % {KEYS}; ks[i][j] = t + j < {sk} ? {} : 0.0f; }}\n",
            d * KEYS,
            load(self.dtypes[1], format!("kt[ko + (unsigned long long)i * {kr}ull + (unsigned long long)(t + j) * {kc}ull]"))
        );
        s += &format!(
            "        for (int e = threadIdx.x; e < {}; e += {ROWS}) {{ int j = e / {dv}, c = e % {dv}; vs[j][c] = t + j < {sk} ? {} : 0.0f; }}\n",
            KEYS * dv,
            load(self.dtypes[2], format!("v[vo + (unsigned long long)(t + j) * {vr}ull + (unsigned long long)c * {vc}ull]"))
        );
        s += "        __syncthreads();\n";
        s += &format!("        if (live) for (int j = 0; j < {KEYS} && t + j < {sk}; ++j) {{\n");
        s += &format!("            float sc = 0.0f;\n            for (int i = 0; i < {d}; ++i) sc += qr[i] * ks[i][j];\n");
        let eargs: String = (0..self.extras.len()).map(|k| format!("e{k}, ")).collect();
        s += &format!(
            "            float x = prologue_{}(sc, {eargs}(z * {sq}ull + (unsigned long long)row) * {sk}ull + (unsigned long long)(t + j));\n",
            self.name
        );
        s += "            float mn = fmaxf(m, x);\n";
        // Until a key is not masked with -inf, nothing is added.
        s += "            if (mn != __int_as_float(0xff800000)) {\n";
        s += "                float c = expf(m - mn), p = expf(x - mn);\n                l = l * c + p;\n";
        s += &format!(
            "                for (int i = 0; i < {dv}; ++i) acc[i] = acc[i] * c + p * vs[j][i];\n                m = mn;\n            }}\n"
        );
        s += "        }\n        __syncthreads();\n    }\n";
        let fallback = if self.nan_to_zero { "0.0f" } else { "__int_as_float(0x7fc00000)" };
        let store = |x: &str| crate::store_c(self.out, x);
        let at = match &self.out_strides {
            None => format!("(z * {sq}ull + (unsigned long long)row) * {dv}ull + i"),
            Some(st) => {
                // The batch coordinates of z, each times its stride.
                let r = st.len();
                s += "    unsigned long long oo = 0;\n    rem = z;\n";
                for b in (0..self.batch.len()).rev() {
                    s += &format!("    oo += (rem % {n}ull) * {}ull; rem /= {n}ull;\n", st[b], n = self.batch[b]);
                }
                format!("oo + (unsigned long long)row * {}ull + (unsigned long long)i * {}ull", st[r - 2], st[r - 1])
            }
        };
        s += &format!(
            "    if (live) for (int i = 0; i < {dv}; ++i) out[{at}] = {};\n}}\n",
            store(&format!("l > 0.0f ? acc[i] / l : {fallback}"))
        );
        s
    }

    /// Runs the description on the CPU in the kernel's order of operations.
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let (q, kt, v) = (inputs[0].to_f32_vec(), inputs[1].to_f32_vec(), inputs[2].to_f32_vec());
        let extras: Vec<Vec<f32>> = inputs[3..].iter().map(|t| t.to_f32_vec()).collect();
        let (sq, sk, d, dv) = (self.sq, self.sk, self.d, self.dv);
        let [(qr, qc), (kr, kc), (vr, vc)] = self.mat_strides;
        let shape = self.scores();
        let mut out = vec![0f32; self.batches() * sq * dv];
        let mut a = vec![0f32; self.extras.len() + 1];
        let mut scratch = Vec::new();
        for z in 0..self.batches() {
            let (mut rem, mut off) = (z, [0usize; 3]);
            for b in (0..self.batch.len()).rev() {
                for (o, st) in off.iter_mut().zip(&self.batch_strides) {
                    *o += (rem % self.batch[b]) * st[b];
                }
                rem /= self.batch[b];
            }
            for row in 0..sq {
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let mut acc = vec![0f32; dv];
                for j in 0..sk {
                    let mut sc = 0f32;
                    for i in 0..d {
                        sc += q[off[0] + row * qr + i * qc] * kt[off[1] + i * kr + j * kc];
                    }
                    let f = (z * sq + row) * sk + j;
                    for (k, a) in a.iter_mut().enumerate() {
                        *a = if k == self.score {
                            sc
                        } else {
                            let e = k - usize::from(k > self.score);
                            let st = &self.extras[e].1;
                            let (mut r, mut at) = (f, 0);
                            for dd in (0..shape.len()).rev() {
                                at += (r % shape[dd]) * st[dd];
                                r /= shape[dd];
                            }
                            extras[e][at]
                        };
                    }
                    let x = self.expr.eval(&a, &mut scratch);
                    let mn = m.max(x);
                    if mn != f32::NEG_INFINITY {
                        let (c, p) = ((m - mn).exp(), (x - mn).exp());
                        l = l * c + p;
                        for (i, acc) in acc.iter_mut().enumerate() {
                            *acc = *acc * c + p * v[off[2] + j * vr + i * vc];
                        }
                        m = mn;
                    }
                }
                let oo = match &self.out_strides {
                    None => (z * sq + row) * dv,
                    Some(st) => {
                        let r = st.len();
                        let (mut rem, mut oo) = (z, row * st[r - 2]);
                        for b in (0..self.batch.len()).rev() {
                            oo += (rem % self.batch[b]) * st[b];
                            rem /= self.batch[b];
                        }
                        oo
                    }
                };
                let col = self.out_strides.as_ref().map_or(1, |st| st[st.len() - 1]);
                for i in 0..dv {
                    out[oo + i * col] = if l > 0.0 {
                        acc[i] / l
                    } else if self.nan_to_zero {
                        0.0
                    } else {
                        f32::NAN
                    };
                }
            }
        }
        Tensor::from_f32(self.output.clone(), out).cast(self.out)
    }
}
