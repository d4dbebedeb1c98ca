//! Fused attention as data, in the style of FlashAttention: one thread per
//! query row, the keys and values staged through shared memory a tile at a
//! time, the softmax computed online in f32 registers (running maximum and
//! sum, the accumulator rescaled as the maximum grows), so the scores
//! `[.., queries, keys]` never exist in memory. The scores' prologue (scale,
//! additive masks) is evaluated per score from its operands' broadcast
//! strides. The same description renders to CUDA C and runs on the CPU in
//! the kernel's order of operations.
//!
//! With f16 or bf16 operands and head dims that are multiples of 16, both
//! products run on tensor cores instead (FlashAttention-2's loop, on
//! `wmma`): a block holds 16 query rows per warp, each key tile's scores
//! `q @ kt` come from 16x16x16 fragments into shared memory, the row's owner
//! lane applies the prologue and the online softmax once per tile (f32 row
//! maximum and sum), writes the probabilities in the operands' half type,
//! the warp rescales its rows of the f32 output accumulator and adds
//! `p @ v` on fragments again.

use crate::elementwise::{expr_body, strides};
use smelt_ir::kernel_op::{ATTENTION_MAX_BATCH, ATTENTION_MAX_HEAD};
use smelt_ir::{DType, Expr, KernelGraph, KernelOp, NodeId, Tensor};

/// Query rows per block (one thread each).
pub const ROWS: usize = 64;
/// Keys per shared-memory tile.
pub const KEYS: usize = 16;
/// Keys per tile on tensor cores.
pub const TC_KEYS: usize = 32;
/// Static shared memory a block may use (bytes).
const SHARED_LIMIT: usize = 48 * 1024;

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
    /// Query rows per block on tensor cores (16 per warp); `None`: one
    /// thread per query row on CUDA cores.
    pub tc_rows: Option<usize>,
}

/// Shared memory of the tensor-core kernel with `rows` query rows per
/// block: q, the key and value tiles and the probabilities in the half
/// type, the scores and the output accumulator in f32, each row padded (the
/// leading dims below), two f32 per row.
fn tc_shared(rows: usize, d: usize, dv: usize) -> usize {
    let [lq, lk, lv, ls, lp, lo] = tc_lds(d, dv);
    2 * (rows * lq + d * lk + TC_KEYS * lv + rows * lp) + 4 * (rows * ls + rows * lo + 2 * rows)
}

/// Leading dims (elements) of q, the key tile, the value tile, the scores,
/// the probabilities and the output accumulator: padded by 16 bytes against
/// bank conflicts, multiples of 8 halves or 4 floats as `wmma` requires.
fn tc_lds(d: usize, dv: usize) -> [usize; 6] {
    [d + 8, TC_KEYS + 8, dv + 8, TC_KEYS + 4, TC_KEYS + 8, dv + 4]
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
        // Tensor cores: one half type for q, kt and v, head dims in whole
        // fragments, the most rows per block whose tiles fit.
        let tc_rows = (crate::tile::tensor_core_type(q.dtype) && kt.dtype == q.dtype && v.dtype == q.dtype && d % 16 == 0 && dv % 16 == 0)
            .then(|| [64, 32, 16].into_iter().find(|&r| tc_shared(r, d, dv) <= SHARED_LIMIT))
            .flatten();
        let suffix = if tc_rows.is_some() { format!("{suffix}_tc") } else { suffix };
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
            tc_rows,
        })
    }

    /// Query rows per block.
    pub fn rows(&self) -> usize {
        self.tc_rows.unwrap_or(ROWS)
    }

    /// Threads per block: a warp per 16 rows on tensor cores, else a thread per row.
    pub fn threads(&self) -> usize {
        self.tc_rows.map_or(ROWS, |r| 2 * r)
    }

    /// Multiply-adds executed, whole fragments and key tiles included.
    pub fn tiled_macs(&self) -> usize {
        match self.tc_rows {
            Some(_) => self.batches() * self.sq.div_ceil(16) * 16 * self.sk.div_ceil(TC_KEYS) * TC_KEYS * (self.d + self.dv),
            None => self.macs(),
        }
    }

    /// Matrices (the grid's y extent).
    pub fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// Grid: (query tiles, matrices).
    pub fn grid(&self) -> [usize; 3] {
        [self.sq.div_ceil(self.rows()).max(1), self.batches().max(1), 1]
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
        if self.tc_rows.is_some() {
            s = s.replacen("#include <cuda_bf16.h>\n", "#include <cuda_bf16.h>\n#include <mma.h>\nusing namespace nvcuda;\n", 1);
        }
        s += &format!("extern \"C\" __global__ void {}({}) {{\n", self.name, params.join(", "));
        s += "    unsigned long long z = blockIdx.y, rem = z, qo = 0, ko = 0, vo = 0;\n";
        for b in (0..self.batch.len()).rev() {
            let [a, k, v] = [&self.batch_strides[0][b], &self.batch_strides[1][b], &self.batch_strides[2][b]];
            s += &format!(
                "    qo += (rem % {n}ull) * {a}ull; ko += (rem % {n}ull) * {k}ull; vo += (rem % {n}ull) * {v}ull; rem /= {n}ull;\n",
                n = self.batch[b]
            );
        }
        let eargs: String = (0..self.extras.len()).map(|k| format!("e{k}, ")).collect();
        let fallback = if self.nan_to_zero { "0.0f" } else { "__int_as_float(0x7fc00000)" };
        if let Some(rows) = self.tc_rows {
            self.tc_body(rows, &eargs, fallback, &mut s);
            return s;
        }
        s += &format!("    __shared__ float ks[{d}][{KEYS}];\n    __shared__ float vs[{KEYS}][{dv}];\n");
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
        let at = self.out_at(&mut s);
        s += &format!(
            "    if (live) for (int i = 0; i < {dv}; ++i) out[{at}] = {};\n}}\n",
            crate::store_c(self.out, &format!("l > 0.0f ? acc[i] / l : {fallback}"))
        );
        s
    }

    /// The output's element index of (`row`, `i`) in matrix `z`, after the
    /// lines that compute its batch offset.
    fn out_at(&self, s: &mut String) -> String {
        let (sq, dv) = (self.sq, self.dv);
        match &self.out_strides {
            None => format!("(z * {sq}ull + (unsigned long long)row) * {dv}ull + i"),
            Some(st) => {
                // The batch coordinates of z, each times its stride.
                let r = st.len();
                *s += "    unsigned long long oo = 0;\n    rem = z;\n";
                for b in (0..self.batch.len()).rev() {
                    *s += &format!("    oo += (rem % {n}ull) * {}ull; rem /= {n}ull;\n", st[b], n = self.batch[b]);
                }
                format!("oo + (unsigned long long)row * {}ull + (unsigned long long)i * {}ull", st[r - 2], st[r - 1])
            }
        }
    }

    /// The tensor-core kernel's body after the batch offsets: `rows` query
    /// rows per block, a warp per 16 of them.
    fn tc_body(&self, rows: usize, eargs: &str, fallback: &str, s: &mut String) {
        let (sq, sk, d, dv, kt) = (self.sq, self.sk, self.d, self.dv, TC_KEYS);
        let (ty, _, half) = crate::c_type(self.dtypes[0]);
        let [lq, lk, lv, ls, lp, lo] = tc_lds(d, dv);
        let threads = 2 * rows;
        let [(qr, qc), (kr, kc), (vr, vc)] = self.mat_strides;
        *s += &format!("    // {} warps of 16 query rows; wmma 16x16x16 in {ty} with f32 accumulators; {kt}-key tiles.\n", rows / 16);
        *s += &format!("    __shared__ __align__(32) {ty} qs[{rows}][{lq}];\n    __shared__ __align__(32) {ty} ks[{d}][{lk}];\n");
        *s += &format!("    __shared__ __align__(32) {ty} vs[{kt}][{lv}];\n    __shared__ __align__(32) {ty} ps[{rows}][{lp}];\n");
        *s += &format!("    __shared__ __align__(32) float ss[{rows}][{ls}];\n    __shared__ __align__(32) float os[{rows}][{lo}];\n");
        *s += &format!("    __shared__ float cs[{rows}], lsum[{rows}];\n");
        *s += &format!("    const int tid = threadIdx.x, lane = tid % 32, w0 = tid / 32 * 16, r0 = blockIdx.x * {rows};\n");
        *s += &format!("    const {ty} zero = {half}(0.0f);\n    const float ninf = __int_as_float(0xff800000);\n");
        // A tile of the block's threads, the dim of the smaller source stride fastest: coalesced reads.
        let fill = |dst: &str, (nr, nc): (usize, usize), (sr, sc): (usize, usize), ok: &str, at: &str| {
            let (r, c) = if sc <= sr { (format!("e / {nc}"), format!("e % {nc}")) } else { (format!("e % {nr}"), format!("e / {nr}")) };
            format!(
                "        for (int e = tid; e < {}; e += {threads}) {{ int r = {r}, c = {c}; {dst}[r][c] = {ok} ? {at} : zero; }}\n",
                nr * nc
            )
        };
        *s += &fill(
            "qs",
            (rows, d),
            (qr, qc),
            &format!("r0 + r < {sq}"),
            &format!("q[qo + (unsigned long long)(r0 + r) * {qr}ull + (unsigned long long)c * {qc}ull]"),
        )
        .replacen("        ", "    ", 1);
        *s += &format!("    for (int e = tid; e < {}; e += {threads}) os[e / {dv}][e % {dv}] = 0.0f;\n", rows * dv);
        *s += &format!(
            "    const int row = r0 + w0 + lane;\n    const bool owner = lane < 16, live = owner && row < {sq};\n    float m = ninf, l = 0.0f;\n"
        );
        *s += &format!("    for (int t = 0; t < {sk}; t += {kt}) {{\n        __syncthreads();\n");
        *s += &fill(
            "ks",
            (d, kt),
            (kr, kc),
            &format!("t + c < {sk}"),
            &format!("kt[ko + (unsigned long long)r * {kr}ull + (unsigned long long)(t + c) * {kc}ull]"),
        );
        *s += &fill(
            "vs",
            (kt, dv),
            (vr, vc),
            &format!("t + r < {sk}"),
            &format!("v[vo + (unsigned long long)(t + r) * {vr}ull + (unsigned long long)c * {vc}ull]"),
        );
        *s += "        __syncthreads();\n";
        let frag = |usage: &str| format!("wmma::fragment<wmma::{usage}, 16, 16, 16, {ty}, wmma::row_major>");
        *s += "        // This warp's scores, q @ kt, into shared memory.\n";
        *s += &format!("        for (int n = 0; n < {}; ++n) {{\n", kt / 16);
        *s += "            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;\n            wmma::fill_fragment(acc, 0.0f);\n";
        *s += &format!("            for (int kk = 0; kk < {}; ++kk) {{\n", d / 16);
        *s += &format!("                {} fa;\n                {} fb;\n", frag("matrix_a"), frag("matrix_b"));
        *s += &format!(
            "                wmma::load_matrix_sync(fa, &qs[w0][16 * kk], {lq});\n                wmma::load_matrix_sync(fb, &ks[16 * kk][16 * n], {lk});\n"
        );
        *s += "                wmma::mma_sync(acc, fa, fb, acc);\n            }\n";
        *s += &format!(
            "            wmma::store_matrix_sync(&ss[w0][16 * n], acc, {ls}, wmma::mem_row_major);\n        }}\n        __syncwarp();\n"
        );
        *s += "        // Each row's owner: the prologue, the tile's maximum, the rescale and the probabilities.\n";
        *s += "        if (owner) {\n            float* x = ss[w0 + lane];\n            float mt = ninf;\n";
        *s += &format!("            for (int j = 0; j < {kt}; ++j) {{\n");
        *s += &format!(
            "                x[j] = live && t + j < {sk} ? prologue_{}(x[j], {eargs}(z * {sq}ull + (unsigned long long)row) * {sk}ull + (unsigned long long)(t + j)) : ninf;\n",
            self.name
        );
        *s += "                mt = fmaxf(mt, x[j]);\n            }\n";
        *s += "            float mn = fmaxf(m, mt);\n            bool any = mn != ninf;\n            float c = any ? expf(m - mn) : 1.0f;\n            l = l * c;\n";
        *s += &format!(
            "            for (int j = 0; j < {kt}; ++j) {{\n                float p = any ? expf(x[j] - mn) : 0.0f;\n                l += p;\n                ps[w0 + lane][j] = {half}(p);\n            }}\n"
        );
        *s += "            cs[w0 + lane] = c;\n            m = mn;\n        }\n        __syncwarp();\n";
        *s += &format!("        for (int e = lane; e < {}; e += 32) os[w0 + e / {dv}][e % {dv}] *= cs[w0 + e / {dv}];\n", 16 * dv);
        *s += "        __syncwarp();\n        // The rescaled accumulator plus p @ v.\n";
        *s += &format!("        for (int j = 0; j < {}; ++j) {{\n", dv / 16);
        *s += &format!(
            "            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;\n            wmma::load_matrix_sync(acc, &os[w0][16 * j], {lo}, wmma::mem_row_major);\n"
        );
        *s += &format!("            for (int kk = 0; kk < {}; ++kk) {{\n", kt / 16);
        *s += &format!("                {} fa;\n                {} fb;\n", frag("matrix_a"), frag("matrix_b"));
        *s += &format!(
            "                wmma::load_matrix_sync(fa, &ps[w0][16 * kk], {lp});\n                wmma::load_matrix_sync(fb, &vs[16 * kk][16 * j], {lv});\n"
        );
        *s += "                wmma::mma_sync(acc, fa, fb, acc);\n            }\n";
        *s += &format!("            wmma::store_matrix_sync(&os[w0][16 * j], acc, {lo}, wmma::mem_row_major);\n        }}\n    }}\n");
        *s += "    if (owner) lsum[w0 + lane] = l;\n    __syncthreads();\n";
        let at = self.out_at(s);
        *s += &format!("    for (int e = tid; e < {}; e += {threads}) {{\n", rows * dv);
        *s += &format!("        int r = e / {dv}, i = e % {dv}, row = r0 + r;\n");
        *s += &format!(
            "        if (row < {sq}) out[{at}] = {};\n    }}\n}}\n",
            crate::store_c(self.out, &format!("lsum[r] > 0.0f ? os[r][i] / lsum[r] : {fallback}"))
        );
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
                // The score of key j after the prologue.
                let mut score = |j: usize| {
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
                    self.expr.eval(&a, &mut scratch)
                };
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let mut acc = vec![0f32; dv];
                if self.tc_rows.is_some() {
                    // A tile of keys at a time; the probabilities rounded to the operands' type.
                    for t in (0..sk).step_by(TC_KEYS) {
                        let xs: Vec<f32> = (t..t + TC_KEYS).map(|j| if j < sk { score(j) } else { f32::NEG_INFINITY }).collect();
                        let mn = m.max(xs.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)));
                        let any = mn != f32::NEG_INFINITY;
                        let c = if any { (m - mn).exp() } else { 1.0 };
                        l *= c;
                        let ps: Vec<f32> = xs.iter().map(|&x| if any { (x - mn).exp() } else { 0.0 }).collect();
                        for p in &ps {
                            l += p;
                        }
                        acc.iter_mut().for_each(|a| *a *= c);
                        for (j, p) in (t..sk.min(t + TC_KEYS)).zip(&ps) {
                            let p = smelt_ir::round_to(self.dtypes[2], *p);
                            for (i, acc) in acc.iter_mut().enumerate() {
                                *acc += p * v[off[2] + j * vr + i * vc];
                            }
                        }
                        m = mn;
                    }
                } else {
                    for j in 0..sk {
                        let x = score(j);
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
