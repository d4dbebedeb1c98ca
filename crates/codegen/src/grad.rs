//! Backward kernels as data: the gradients of convolution (data and
//! weights), max and average pooling and LRN, over 2-D images. One thread
//! per output element gathers what it needs (no atomics, so the result is
//! deterministic): a data gradient walks the outputs whose windows cover its
//! element, a weight gradient sums over the batch and the output positions
//! (both as tiled GEMMs, a tile of outputs a block, when not grouped; on
//! tensor cores in f16 and bf16, and in TF32 for f32 where allowed, on
//! 64x64 tiles, or a weight gradient's 32x32 tiles with the sum split
//! between warps). The same description renders to CUDA C and runs on the
//! CPU.

use smelt_ir::{Conv as ConvAttrs, DType, KernelGraph, KernelOp, NodeId, Op, Pool, Tensor};

/// A convolution gradient's tile: `TILE x TILE` outputs a block.
pub const TILE: usize = 16;
/// The reduction steps staged in shared memory at a time (a slice's
/// chunk of the sum).
const KSTEP: usize = 32;
/// Blocks that keep a large GPU busy (4 of 256 threads on each of 132
/// multiprocessors).
const SPREAD: usize = 528;

/// How a convolution gradient's GEMM is spread over a block's threads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tiling {
    /// A 64x64 tile, 4x4 outputs a thread.
    Registers,
    /// A `t x t` tile, one output a thread in each of `TILE² / t²`
    /// slices of the sum.
    Split {
        /// The tile's side.
        t: usize,
    },
    /// On tensor cores, a weight gradient's [`TC_SPLIT_TILE`]² tile, its
    /// 8 warps in [`TC_SLICES`] slices of the sum (two warps a slice, each
    /// a 32x16 half of the tile), the slices added in order at the end.
    TensorSplit,
}

/// The tile side of [`Tiling::TensorSplit`].
const TC_SPLIT_TILE: usize = 32;
/// The slices of [`Tiling::TensorSplit`]'s sum.
const TC_SLICES: usize = 4;

/// Which gradient.
#[derive(Clone, Debug, PartialEq)]
pub enum GradKind {
    /// dx of a convolution: inputs dy, w.
    ConvData(ConvAttrs),
    /// dW of a convolution: inputs x, dy.
    ConvWeight(ConvAttrs),
    /// dx of max pooling: inputs x, dy.
    MaxPool(Pool),
    /// dx of average pooling (count padding or not): input dy.
    AvgPool(Pool, bool),
    /// dx of a gather (a scatter-add, any rank): inputs indices, dy.
    Gather {
        /// The indexed axis.
        axis: usize,
        /// The indices' dtype (i64 or i32).
        index: DType,
    },
    /// dx of LRN: inputs x, dy.
    Lrn(smelt_ir::Lrn),
}

/// A backward kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Grad {
    /// A stable, readable name, e.g. `conv_grad_data_k3s2_n2c4h6w6`.
    pub name: String,
    /// What it computes.
    pub kind: GradKind,
    /// Operand shapes, in the node's order.
    pub inputs: Vec<Vec<usize>>,
    /// Output shape.
    pub output: Vec<usize>,
    /// Element type of operands and output.
    pub dtype: DType,
    /// An f32 convolution gradient's products may run in TF32 (`--tf32`
    /// conv or on): they do where it is on tensor cores.
    pub tf32: bool,
}

/// `[N, C, H, W]` of a rank-4 shape.
/// Fills `out` by `f(start, chunk)` over contiguous chunks, on the CPU's
/// cores when there is enough work (`per_element` multiply-adds each). Each
/// element is computed whole by one call, so the result does not depend on
/// the split.
fn par_fill(out: &mut [f32], per_element: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if threads == 1 || out.len().saturating_mul(per_element) < 1 << 20 {
        return f(0, out);
    }
    let chunk = out.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (k, part) in out.chunks_mut(chunk).enumerate() {
            let f = &f;
            s.spawn(move || f(k * chunk, part));
        }
    });
}

fn nchw(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

impl Grad {
    /// The description of node `id`, if it is a backward op over 2-D images.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Grad> {
        let node = g.node(id);
        let (kind, tag) = match &node.op {
            KernelOp::Op(Op::ConvGradData { conv, .. }) => (GradKind::ConvData(conv.clone()), "conv_grad_data"),
            KernelOp::Op(Op::ConvGradWeight { conv, .. }) => (GradKind::ConvWeight(conv.clone()), "conv_grad_weight"),
            KernelOp::Op(Op::MaxPoolGrad(p)) => (GradKind::MaxPool(p.clone()), "max_pool_grad"),
            KernelOp::Op(Op::AvgPoolGrad { pool, count_include_pad, .. }) => {
                (GradKind::AvgPool(pool.clone(), *count_include_pad), "avg_pool_grad")
            }
            KernelOp::Op(Op::GatherGrad { axis, .. }) => {
                (GradKind::Gather { axis: *axis, index: g.ty(g.inputs_of(id)[0]).dtype }, "gather_grad")
            }
            KernelOp::Op(Op::LrnGrad(l)) => (GradKind::Lrn(*l), "lrn_grad"),
            _ => return None,
        };
        let inputs: Vec<Vec<usize>> = g.inputs_of(id).iter().map(|v| g.ty(*v).shape.clone()).collect();
        let out = &node.outputs[0];
        let images = !matches!(kind, GradKind::Gather { .. });
        if images && (out.shape.len() != 4 || inputs.iter().any(|s| s.len() != 4)) || !out.dtype.is_float() {
            return None;
        }
        let window = match &kind {
            GradKind::ConvData(c) | GradKind::ConvWeight(c) => format!("s{}d{}g{}_", c.strides[0], c.dilations[0], c.group),
            GradKind::MaxPool(p) | GradKind::AvgPool(p, _) => format!("k{}x{}s{}_", p.kernel[0], p.kernel[1], p.strides[0]),
            GradKind::Lrn(smelt_ir::Lrn { size, .. }) => format!("n{size}_"),
            GradKind::Gather { axis, index } => format!("a{axis}_{index}_{}_", inputs[0].iter().product::<usize>()),
        };
        let dims: Vec<String> = out.shape.iter().map(|d| d.to_string()).collect();
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let tf32 = out.dtype == DType::F32 && g.tf32().convs() && matches!(kind, GradKind::ConvData(_) | GradKind::ConvWeight(_));
        let mut grad = Grad {
            name: format!("{tag}_{window}{}{suffix}", dims.join("x")),
            kind,
            inputs,
            output: out.shape.clone(),
            dtype: out.dtype,
            tf32,
        };
        grad.tf32 = tf32 && grad.tensor_cores();
        if grad.tf32 {
            grad.name += "_tf32";
        }
        Some(grad)
    }

    /// Output elements (threads).
    pub fn numel(&self) -> usize {
        self.output.iter().product()
    }

    /// Multiply-adds, for reports.
    pub fn macs(&self) -> usize {
        let per = match &self.kind {
            GradKind::ConvData(c) => {
                let w = nchw(&self.inputs[1]);
                w[0] / c.group * w[2] * w[3]
            }
            GradKind::ConvWeight(_) => {
                let dy = nchw(&self.inputs[1]);
                dy[0] * dy[2] * dy[3]
            }
            GradKind::MaxPool(p) | GradKind::AvgPool(p, _) => p.kernel.iter().product(),
            GradKind::Lrn(smelt_ir::Lrn { size, .. }) => size * size,
            GradKind::Gather { .. } => self.inputs[0].iter().product(),
        };
        self.numel() * per
    }

    /// The (M, N, K) of a convolution gradient computed as a tiled GEMM, a
    /// [`TILE`]² tile of outputs a block: the weight gradient as
    /// `dw[co][j] = sum_k dy[co][k] * xcol[j][k]` (j = (ci, kh, kw), k =
    /// (image, output row, output column)), the data gradient as
    /// `dx[c][p] = sum_r w[r][c] * dycol[p][r]` (p = (image, row, column),
    /// r = (output channel, kh, kw)). `None` for every other gradient, a
    /// grouped one, or one whose extents need 64-bit indices.
    fn gemm(&self) -> Option<(usize, usize, usize)> {
        let (GradKind::ConvWeight(c) | GradKind::ConvData(c)) = &self.kind else { return None };
        let (x, dy) = match self.kind {
            GradKind::ConvWeight(_) => (&self.inputs[0], &self.inputs[1]),
            _ => (&self.output, &self.inputs[0]),
        };
        let [n, ch, h, w] = nchw(x);
        let [_, m, oh, ow] = nchw(dy);
        let [_, _, kh, kw] = nchw(if matches!(self.kind, GradKind::ConvWeight(_)) { &self.output } else { &self.inputs[1] });
        let mnk = match self.kind {
            GradKind::ConvWeight(_) => (m, ch * kh * kw, n * oh * ow),
            _ => (ch, n * h * w, m * kh * kw),
        };
        let fits = [mnk.0, mnk.1, mnk.2, n * ch * h * w, n * m * oh * ow, m * ch * kh * kw].iter().all(|&e| e < 1 << 31);
        (c.group == 1 && fits).then_some(mnk)
    }

    /// How the GEMM of [`Grad::gemm`] is spread over blocks: 64x64 tiles
    /// where there are enough of them to fill a large GPU; else a weight
    /// gradient (few outputs, a long sum) takes the largest tile that
    /// still gives [`SPREAD`] blocks (the smallest if none does), its
    /// threads splitting the sum, or on tensor cores 32x32 tiles whose warps
    /// split it where those are at least a quarter of [`SPREAD`]; a data
    /// gradient, 16x16.
    fn tiling(&self, m: usize, n: usize) -> Tiling {
        let blocks = |t: usize| m.div_ceil(t) * n.div_ceil(t);
        if blocks(4 * TILE) >= 256 {
            Tiling::Registers
        } else if !matches!(self.kind, GradKind::ConvWeight(_)) {
            Tiling::Split { t: TILE }
        } else if (crate::tile::tensor_core_type(self.dtype) || self.tf32) && blocks(TC_SPLIT_TILE) >= SPREAD / 4 {
            // A 32x32 tile a block on tensor cores where there are enough
            // of them for a block on most multiprocessors; fewer would
            // leave the GPU's bandwidth idle (the CUDA-core split spreads
            // smaller tiles wider).
            Tiling::TensorSplit
        } else {
            Tiling::Split { t: [TILE, TILE / 2].into_iter().find(|&t| blocks(t) >= SPREAD).unwrap_or(TILE / 4) }
        }
    }

    /// Launch geometry: a tile of a convolution gradient per block of
    /// `TILE * TILE` threads (see [`Grad::gemm`]), else one thread per
    /// output element.
    pub fn launch(&self) -> crate::launch::Launch {
        match self.gemm() {
            Some((m, n, _)) => {
                let t = match self.tiling(m, n) {
                    Tiling::Registers => 4 * TILE,
                    Tiling::Split { t } => t,
                    Tiling::TensorSplit => TC_SPLIT_TILE,
                };
                crate::launch::Launch { grid: [n.div_ceil(t), m.div_ceil(t), 1], block: [TILE * TILE, 1, 1], count: Some(self.numel()) }
            }
            None => {
                let b = crate::launch::BLOCK;
                crate::launch::Launch { grid: [self.numel().div_ceil(b).max(1), 1, 1], block: [b, 1, 1], count: Some(self.numel()) }
            }
        }
    }

    /// A convolution gradient as a tiled GEMM (see [`Grad::gemm`]): each
    /// step stages a `TILE x KSTEP` slice of both operands in shared memory
    /// (zero outside the image); each thread sums its element over k in
    /// order, as the CPU description does, taking the taps outside the
    /// image as zeros.
    fn gemm_cuda(&self, c: &ConvAttrs, (m, n, k): (usize, usize, usize)) -> String {
        let (ty, load, store) = crate::c_type(self.dtype);
        let (t, kc) = (TILE, KSTEP);
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        if self.tensor_cores() {
            s += "#include <mma.h>\nusing namespace nvcuda;\n";
        }
        s += "\n";
        s += &format!("// {}: {:?}, inputs {:?} -> {:?}\n", self.name, self.kind, self.inputs, self.output);
        // Per operand: the code setting `v` from row `r` (< its extent) and
        // `k`, and whether consecutive threads load consecutive k (else
        // consecutive rows), whichever is contiguous in memory.
        let (a, b, out) = match self.kind {
            GradKind::ConvWeight(_) => {
                let [_, ch, h, w] = nchw(&self.inputs[0]);
                let [_, _, oh, ow] = nchw(&self.inputs[1]);
                let [_, _, kh, kw] = nchw(&self.output);
                let a = format!(
                    "const unsigned int b = k / {}u, p = k % {}u;\n                v = {load}(in1[((unsigned long long)b * {m}ull + r) * {}ull + p]);",
                    oh * ow,
                    oh * ow,
                    oh * ow
                );
                let b = format!(
                    "const unsigned int b = k / {}u, p = k % {}u, y = p / {ow}u, x = p % {ow}u, ci = r / {}u, a = r / {kw}u % {kh}u, q = r % {kw}u;\n                \
                     const int ih = (int)(y * {}u + a * {}u) - {}, iw = (int)(x * {}u + q * {}u) - {};\n                \
                     if (ih >= 0 && ih < {h} && iw >= 0 && iw < {w}) v = {load}(in0[(((unsigned long long)b * {ch}ull + ci) * {h}ull + ih) * {w}ull + iw]);",
                    oh * ow,
                    oh * ow,
                    kh * kw,
                    c.strides[0],
                    c.dilations[0],
                    c.pads[0],
                    c.strides[1],
                    c.dilations[1],
                    c.pads[1]
                );
                ((a, true), (b, true), format!("(unsigned long long)i * {n}ull + j"))
            }
            _ => {
                let [_, ch, h, w] = nchw(&self.output);
                let [_, mo, oh, ow] = nchw(&self.inputs[0]);
                let [_, _, kh, kw] = nchw(&self.inputs[1]);
                let a = format!(
                    "const unsigned int o = k / {}u, t = k % {}u;\n                v = {load}(in1[((unsigned long long)o * {ch}ull + r) * {}ull + t]);",
                    kh * kw,
                    kh * kw,
                    kh * kw
                );
                let b = format!(
                    "const unsigned int b = r / {}u, y = r / {w}u % {h}u, x = r % {w}u, o = k / {}u, a = k / {kw}u % {kh}u, q = k % {kw}u;\n                \
                     const int th = (int)(y + {}u) - (int)(a * {}u), tw = (int)(x + {}u) - (int)(q * {}u);\n                \
                     if (th >= 0 && tw >= 0 && th % {s0} == 0 && tw % {s1} == 0 && th / {s0} < {oh} && tw / {s1} < {ow}) \
                     v = {load}(in0[(((unsigned long long)b * {mo}ull + o) * {oh}ull + th / {s0}) * {ow}ull + tw / {s1}]);",
                    h * w,
                    kh * kw,
                    c.pads[0],
                    c.dilations[0],
                    c.pads[1],
                    c.dilations[1],
                    s0 = c.strides[0],
                    s1 = c.strides[1],
                );
                let out = format!("((unsigned long long)(j / {}u) * {ch}ull + i) * {}ull + j % {}u", h * w, h * w, h * w);
                ((a, true), (b, false), out)
            }
        };
        match self.tiling(m, n) {
            Tiling::TensorSplit => return s + &self.gemm_tc_split(a, b, &out, (m, n, k)),
            _ if self.tensor_cores() => return s + &self.gemm_tc(a, b, &out, (m, n, k)),
            _ => {}
        }
        // Registers: thread (ty, tx) sums outputs (i0 + ty + TILE u, j0 + tx
        // + TILE v), u, v < 4, over every k. Split: thread (sl, ty, tx) sums
        // output (i0 + ty, j0 + tx) over the KSTEP-long chunks c of k with c
        // % slices == sl; the slices are added in order at the end.
        let (rt, tt, slices, kc) = match self.tiling(m, n) {
            Tiling::Registers => (4, 4 * t, 1, kc / 2),
            Tiling::Split { t: tt } => (1, tt, t * t / (tt * tt), kc),
            Tiling::TensorSplit => unreachable!("on tensor cores"),
        };
        let kb = kc * slices; // k staged a step
        let what = if slices > 1 { format!("{slices} slices of the sum") } else { format!("{rt}x{rt} a thread") };
        s += &format!("// out[i][j] = sum_k a[i][k] * b[j][k]: M {m}, N {n}, K {k}, {tt}x{tt} tiles ({what}), {kb} k a step\n");
        s += &format!(
            "extern \"C\" __global__ void {}(const {ty}* __restrict__ in0, const {ty}* __restrict__ in1, {ty}* __restrict__ out, unsigned long long n) {{\n",
            self.name
        );
        s += &format!("    __shared__ float as[{tt}][{}];\n    __shared__ float bs[{tt}][{}];\n", kb + 1, kb + 1);
        if slices > 1 {
            s += &format!("    __shared__ float part[{}];\n", t * t);
        }
        let cells = tt * tt / (rt * rt); // threads a slice
        s += &format!(
            "    const unsigned int tid = threadIdx.x, sl = tid / {cells}u, tx = tid % {cells}u % {}u, ty = tid % {cells}u / {}u;\n",
            tt / rt,
            tt / rt
        );
        s += &format!("    const unsigned int i0 = blockIdx.y * {tt}u, j0 = blockIdx.x * {tt}u;\n    float acc[{rt}][{rt}] = {{}};\n");
        s += &format!("    for (unsigned int k0 = 0; k0 < {k}u; k0 += {kb}u) {{\n");
        for (name, (code, k_fastest), base, extent) in [("as", a, "i0", m), ("bs", b, "j0", n)] {
            let (row, kk) =
                if k_fastest { (format!("e / {kb}u"), format!("e % {kb}u")) } else { (format!("e % {tt}u"), format!("e / {tt}u")) };
            s += &format!("        for (unsigned int e = tid; e < {}u; e += {}u) {{\n", tt * kb, t * t);
            s += &format!(
                "            const unsigned int row = {row}, kk = {kk}, k = k0 + kk, r = {base} + row;\n            float v = 0.0f;\n"
            );
            s += &format!("            if (k < {k}u && r < {extent}u) {{\n                {code}\n            }}\n            {name}[row][kk] = v;\n        }}\n");
        }
        s += "        __syncthreads();\n";
        s += &format!("        #pragma unroll\n        for (int kk = sl * {kc}; kk < sl * {kc} + {kc}; ++kk) {{\n");
        let step = tt / rt;
        s += &format!(
            "            float av[{rt}], bv[{rt}];\n            #pragma unroll\n            for (int u = 0; u < {rt}; ++u) {{ av[u] = as[ty + {step} * u][kk]; bv[u] = bs[tx + {step} * u][kk]; }}\n"
        );
        s += &format!("            #pragma unroll\n            for (int u = 0; u < {rt}; ++u)\n                #pragma unroll\n                for (int v = 0; v < {rt}; ++v) acc[u][v] += av[u] * bv[v];\n        }}\n");
        s += "        __syncthreads();\n    }\n";
        if slices > 1 {
            s += "    part[tid] = acc[0][0];\n    __syncthreads();\n";
            s += &format!("    if (sl != 0) return;\n    float sum = part[tid];\n    for (unsigned int q = 1; q < {slices}u; ++q) sum += part[q * {cells}u + tid];\n");
            s += "    acc[0][0] = sum;\n";
        }
        s += &format!(
            "    #pragma unroll\n    for (int u = 0; u < {rt}; ++u)\n        #pragma unroll\n        for (int v = 0; v < {rt}; ++v) {{\n"
        );
        s += &format!(
            "            const unsigned int i = i0 + ty + {step} * u, j = j0 + tx + {step} * v;\n            if (i < {m}u && j < {n}u) out[{out}] = {store}(acc[u][v]);\n        }}\n}}\n"
        );
        s
    }

    /// Whether it runs on tensor cores: a convolution gradient in f16 or
    /// bf16, or in f32 where TF32 is allowed, on 64x64 tiles or a weight
    /// gradient's split 32x32 tiles (see [`Grad::tiling`]).
    pub fn tensor_cores(&self) -> bool {
        (crate::tile::tensor_core_type(self.dtype) || self.tf32)
            && self.gemm().is_some_and(|(m, n, _)| matches!(self.tiling(m, n), Tiling::Registers | Tiling::TensorSplit))
    }

    /// The body of [`Grad::gemm_cuda`] on tensor cores: 64x64 tiles of 8
    /// warps, each 16x32 of them as 1x2 `wmma` products (16x16x16 of
    /// halves, or 16x16x8 in TF32, operands rounded once loaded; f32
    /// accumulators); both operands staged in their own type, `a` as
    /// `[i][k]` (row-major A), `b` as `[j][k]` (column-major B), 32 k a
    /// step; the results go through shared memory to coalesced stores.
    fn gemm_tc(&self, (a, a_k): (String, bool), (b, b_k): (String, bool), out: &str, (m, n, k): (usize, usize, usize)) -> String {
        let (ty, _, store) = crate::c_type(self.dtype);
        let (t, kb, threads) = (4 * TILE, KSTEP, TILE * TILE);
        let ld = kb + 8;
        let mut s = format!("// out[i][j] = sum_k a[i][k] * b[j][k]: M {m}, N {n}, K {k}, {t}x{t} tiles on tensor cores, {kb} k a step\n");
        s += &format!(
            "extern \"C\" __global__ void {}(const {ty}* __restrict__ in0, const {ty}* __restrict__ in1, {ty}* __restrict__ out, unsigned long long n) {{\n",
            self.name
        );
        s += &format!("    __shared__ __align__(32) {ty} as[{t}][{ld}];\n    __shared__ __align__(32) {ty} bs[{t}][{ld}];\n");
        s += &format!("    __shared__ __align__(32) float cs[{t}][{}];\n", t + 4);
        s += &format!("    const unsigned int tid = threadIdx.x, wm = tid / 64u * 16u, wn = tid / 32u % 2u * 32u;\n    const unsigned int i0 = blockIdx.y * {t}u, j0 = blockIdx.x * {t}u;\n");
        s += &format!("    const {ty} zero = {store}(0.0f);\n");
        let (fty, fk) = self.fragment();
        s += &format!("    wmma::fragment<wmma::accumulator, 16, 16, {fk}, float> acc[2];\n    wmma::fill_fragment(acc[0], 0.0f);\n    wmma::fill_fragment(acc[1], 0.0f);\n");
        s += &format!("    for (unsigned int k0 = 0; k0 < {k}u; k0 += {kb}u) {{\n");
        s += &self.stage(("as", &a, a_k), ("i0", m), (t, kb, k));
        s += &self.stage(("bs", &b, b_k), ("j0", n), (t, kb, k));
        s += "        __syncthreads();\n";
        s += &format!("        #pragma unroll\n        for (int kk = 0; kk < {kb}; kk += {fk}) {{\n");
        s += &format!("            wmma::fragment<wmma::matrix_a, 16, 16, {fk}, {fty}, wmma::row_major> fa;\n");
        s += &format!("            wmma::fragment<wmma::matrix_b, 16, 16, {fk}, {fty}, wmma::col_major> fb[2];\n");
        s += &format!("            wmma::load_matrix_sync(fa, &as[wm][kk], {ld});\n");
        s += &format!("            wmma::load_matrix_sync(fb[0], &bs[wn][kk], {ld});\n            wmma::load_matrix_sync(fb[1], &bs[wn + 16u][kk], {ld});\n");
        s += &self.round_fragment("fa", "            ");
        s += &self.round_fragment("fb[0]", "            ");
        s += &self.round_fragment("fb[1]", "            ");
        s += "            wmma::mma_sync(acc[0], fa, fb[0], acc[0]);\n            wmma::mma_sync(acc[1], fa, fb[1], acc[1]);\n        }\n";
        s += "        __syncthreads();\n    }\n";
        s += &format!(
            "    wmma::store_matrix_sync(&cs[wm][wn], acc[0], {ldc}, wmma::mem_row_major);\n    wmma::store_matrix_sync(&cs[wm][wn + 16u], acc[1], {ldc}, wmma::mem_row_major);\n    __syncthreads();\n",
            ldc = t + 4
        );
        s += &format!("    for (unsigned int e = tid; e < {}u; e += {threads}u) {{\n", t * t);
        s += &format!("        const unsigned int i = i0 + e / {t}u, j = j0 + e % {t}u;\n");
        s += &format!("        if (i < {m}u && j < {n}u) out[{out}] = {store}(cs[e / {t}u][e % {t}u]);\n    }}\n}}\n");
        s
    }

    /// The fragments' element type and depth: the half type and 16, or
    /// TF32 and 8.
    fn fragment(&self) -> (&'static str, usize) {
        if self.tf32 {
            ("wmma::precision::tf32", 8)
        } else {
            (crate::c_type(self.dtype).0, 16)
        }
    }

    /// The loops staging `rows x kb` of operand `name` (`code` sets `v` from
    /// row `r` and `k`; `k_fastest`: consecutive threads read consecutive
    /// k) in its own type, zero outside the GEMM.
    fn stage(
        &self,
        (name, code, k_fastest): (&str, &str, bool),
        (base, extent): (&str, usize),
        (rows, kb, k): (usize, usize, usize),
    ) -> String {
        let (ty, load, _) = crate::c_type(self.dtype);
        let threads = TILE * TILE;
        // The operand in its own type: no conversion on load.
        let code = code.replace(&format!("{load}("), "(");
        let (row, kk) =
            if k_fastest { (format!("e / {kb}u"), format!("e % {kb}u")) } else { (format!("e % {rows}u"), format!("e / {rows}u")) };
        let mut s = format!("        for (unsigned int e = tid; e < {}u; e += {threads}u) {{\n", rows * kb);
        s +=
            &format!("            const unsigned int row = {row}, kk = {kk}, k = k0 + kk, r = {base} + row;\n            {ty} v = zero;\n");
        s + &format!("            if (k < {k}u && r < {extent}u) {{\n                {code}\n            }}\n            {name}[row][kk] = v;\n        }}\n")
    }

    /// Statements rounding fragment `f`'s elements to TF32 (none for halves).
    fn round_fragment(&self, f: &str, indent: &str) -> String {
        if self.tf32 {
            format!("{indent}for (int t = 0; t < {f}.num_elements; ++t) {f}.x[t] = wmma::__float_to_tf32({f}.x[t]);\n")
        } else {
            String::new()
        }
    }

    /// A weight gradient on tensor cores in [`Tiling::TensorSplit`]: a
    /// 32x32 tile a block; warp w sums slice w / 2 (the 32-long chunks c of
    /// k with c % 4 == w / 2, as the description deals them) for columns
    /// (w % 2) * 16 of the tile, as two fragments; the slices' sums meet in
    /// shared memory in slice order, fragment elements added in place (the
    /// same shape maps elements alike).
    fn gemm_tc_split(&self, (a, a_k): (String, bool), (b, b_k): (String, bool), out: &str, (m, n, k): (usize, usize, usize)) -> String {
        let (ty, _, store) = crate::c_type(self.dtype);
        let (fty, fk) = self.fragment();
        let (t, kb, threads) = (TC_SPLIT_TILE, KSTEP * TC_SLICES, TILE * TILE);
        let (ld, ldc) = (kb + 8, t + 4);
        let mut s = format!(
            "// out[i][j] = sum_k a[i][k] * b[j][k]: M {m}, N {n}, K {k}, {t}x{t} tiles on tensor cores, {TC_SLICES} slices of the sum, {kb} k a step\n"
        );
        s += &format!(
            "extern \"C\" __global__ void {}(const {ty}* __restrict__ in0, const {ty}* __restrict__ in1, {ty}* __restrict__ out, unsigned long long n) {{\n",
            self.name
        );
        s += &format!("    __shared__ __align__(32) {ty} as[{t}][{ld}];\n    __shared__ __align__(32) {ty} bs[{t}][{ld}];\n");
        s += &format!("    __shared__ __align__(32) float cs[{t}][{ldc}];\n");
        s += &format!("    const unsigned int tid = threadIdx.x, sl = tid / 64u, wn = tid / 32u % 2u * 16u;\n    const unsigned int i0 = blockIdx.y * {t}u, j0 = blockIdx.x * {t}u;\n");
        s += &format!("    const {ty} zero = {store}(0.0f);\n");
        s += &format!("    wmma::fragment<wmma::accumulator, 16, 16, {fk}, float> acc[2];\n    wmma::fill_fragment(acc[0], 0.0f);\n    wmma::fill_fragment(acc[1], 0.0f);\n");
        s += &format!("    for (unsigned int k0 = 0; k0 < {k}u; k0 += {kb}u) {{\n");
        s += &self.stage(("as", &a, a_k), ("i0", m), (t, kb, k));
        s += &self.stage(("bs", &b, b_k), ("j0", n), (t, kb, k));
        s += "        __syncthreads();\n";
        s += &format!(
            "        #pragma unroll\n        for (unsigned int kk = sl * {KSTEP}u; kk < sl * {KSTEP}u + {KSTEP}u; kk += {fk}u) {{\n"
        );
        s += &format!("            wmma::fragment<wmma::matrix_a, 16, 16, {fk}, {fty}, wmma::row_major> fa[2];\n");
        s += &format!("            wmma::fragment<wmma::matrix_b, 16, 16, {fk}, {fty}, wmma::col_major> fb;\n");
        s += &format!(
            "            wmma::load_matrix_sync(fa[0], &as[0][kk], {ld});\n            wmma::load_matrix_sync(fa[1], &as[16][kk], {ld});\n"
        );
        s += &format!("            wmma::load_matrix_sync(fb, &bs[wn][kk], {ld});\n");
        s += &self.round_fragment("fa[0]", "            ");
        s += &self.round_fragment("fa[1]", "            ");
        s += &self.round_fragment("fb", "            ");
        s += "            wmma::mma_sync(acc[0], fa[0], fb, acc[0]);\n            wmma::mma_sync(acc[1], fa[1], fb, acc[1]);\n        }\n";
        s += "        __syncthreads();\n    }\n";
        s += "    // The slices in order: cs = ((slice 0 + slice 1) + slice 2) + slice 3.\n";
        s += &format!("    if (sl == 0u) {{\n        wmma::store_matrix_sync(&cs[0][wn], acc[0], {ldc}, wmma::mem_row_major);\n        wmma::store_matrix_sync(&cs[16][wn], acc[1], {ldc}, wmma::mem_row_major);\n    }}\n    __syncthreads();\n");
        s += &format!("    for (unsigned int q = 1; q < {TC_SLICES}u; ++q) {{\n        if (sl == q) {{\n");
        s += "            for (int h = 0; h < 2; ++h) {\n";
        s += &format!("                wmma::fragment<wmma::accumulator, 16, 16, {fk}, float> sum;\n");
        s += &format!("                wmma::load_matrix_sync(sum, &cs[16 * h][wn], {ldc}, wmma::mem_row_major);\n");
        s += "                for (int t = 0; t < sum.num_elements; ++t) sum.x[t] = sum.x[t] + acc[h].x[t];\n";
        s += &format!("                wmma::store_matrix_sync(&cs[16 * h][wn], sum, {ldc}, wmma::mem_row_major);\n            }}\n");
        s += "        }\n        __syncthreads();\n    }\n";
        s += &format!("    for (unsigned int e = tid; e < {}u; e += {threads}u) {{\n", t * t);
        s += &format!("        const unsigned int i = i0 + e / {t}u, j = j0 + e % {t}u;\n");
        s += &format!("        if (i < {m}u && j < {n}u) out[{out}] = {store}(cs[e / {t}u][e % {t}u]);\n    }}\n}}\n");
        s
    }

    /// The slices a weight gradient's sum is split into (see
    /// [`Grad::tiling`]): 1 but for a weight gradient on small tiles.
    fn slices(&self) -> usize {
        match self.gemm().map(|(m, n, _)| self.tiling(m, n)) {
            Some(Tiling::Split { t }) => TILE * TILE / (t * t),
            Some(Tiling::TensorSplit) => TC_SLICES,
            _ => 1,
        }
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(const T* in0, [const T* in1,] T* out, n)`.
    pub fn cuda(&self) -> String {
        if let (GradKind::ConvWeight(c) | GradKind::ConvData(c), Some(gemm)) = (&self.kind, self.gemm()) {
            return self.gemm_cuda(c, gemm);
        }
        let (ty, load, store) = crate::c_type(self.dtype);
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n");
        s += &format!("// {}: {:?}, inputs {:?} -> {:?}\n", self.name, self.kind, self.inputs, self.output);
        let ins: Vec<String> = (0..self.inputs.len()).map(|i| format!("const {ty}* __restrict__ in{i}")).collect();
        s += &format!("extern \"C\" __global__ void {}({}, {ty}* __restrict__ out, unsigned long long n) {{\n", self.name, ins.join(", "));
        s += "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n";
        if let GradKind::Gather { axis, index } = &self.kind {
            // out: dx [outer, dim, inner]; in0: indices (m); in1: dy [outer, m, inner]
            let (_, dim, inner) = self.gather_dims(*axis);
            let m: usize = self.inputs[0].iter().product();
            let it = if *index == DType::I32 { "int" } else { "long long" };
            s = s.replace(&format!("const {ty}* __restrict__ in0"), &format!("const {it}* __restrict__ in0"));
            s += &format!("    unsigned long long c = i % {inner}ull, j = (i / {inner}ull) % {dim}ull, o = i / {}ull;\n", dim * inner);
            s += "    float acc = 0.0f;\n";
            s += &format!("    for (unsigned long long k = 0; k < {m}ull; ++k) {{\n        long long x = (long long)in0[k];\n        if (x < 0) x += {dim};\n");
            s += &format!("        if (x == (long long)j) acc += {load}(in1[(o * {m}ull + k) * {inner}ull + c]);\n    }}\n");
            s += &format!("    out[i] = {store}(acc);\n}}\n");
            return s;
        }
        let [_, a1, a2, a3] = nchw(&self.output);
        s += &format!(
            "    long long q3 = i % {a3}ull, q2 = (i / {a3}ull) % {a2}ull, q1 = (i / {}ull) % {a1}ull, q0 = i / {}ull;\n",
            a2 * a3,
            a1 * a2 * a3
        );
        s += "    float acc = 0.0f;\n";
        let ld = |e: &str| format!("{load}({e})");
        match &self.kind {
            GradKind::ConvData(c) => {
                // out: dx [n, c, h, w]; in0: dy [n, m, oh, ow]; in1: w [m, cg, kh, kw]
                let [_, m, oh, ow] = nchw(&self.inputs[0]);
                let [_, cg, kh, kw] = nchw(&self.inputs[1]);
                let mg = m / c.group;
                s += &format!("    long long g = q1 / {cg}, cl = q1 % {cg};\n");
                s += &format!("    for (long long mm = 0; mm < {mg}; ++mm) {{\n        long long m = g * {mg} + mm;\n");
                s += &format!(
                    "        for (long long a = 0; a < {kh}; ++a) {{\n            long long th = q2 + {} - a * {};\n",
                    c.pads[0], c.dilations[0]
                );
                s += &format!("            if (th < 0 || th % {} != 0 || th / {} >= {oh}) continue;\n", c.strides[0], c.strides[0]);
                s += &format!(
                    "            for (long long b = 0; b < {kw}; ++b) {{\n                long long tw = q3 + {} - b * {};\n",
                    c.pads[1], c.dilations[1]
                );
                s += &format!("                if (tw < 0 || tw % {} != 0 || tw / {} >= {ow}) continue;\n", c.strides[1], c.strides[1]);
                s += &format!(
                    "                acc += {} * {};\n            }}\n        }}\n    }}\n",
                    ld(&format!("in0[((q0 * {m} + m) * {oh} + th / {}) * {ow} + tw / {}]", c.strides[0], c.strides[1])),
                    ld(&format!("in1[((m * {cg} + cl) * {kh} + a) * {kw} + b]"))
                );
            }
            GradKind::ConvWeight(c) => {
                // out: dw [m, cg, kh, kw]; in0: x [n, c, h, w]; in1: dy [n, m, oh, ow]
                let [n, ch, h, w] = nchw(&self.inputs[0]);
                let [_, m, oh, ow] = nchw(&self.inputs[1]);
                let cg = ch / c.group;
                let mg = m / c.group;
                s += &format!("    long long ci = (q0 / {mg}) * {cg} + q1;\n");
                s += &format!("    for (long long b = 0; b < {n}; ++b) {{\n        for (long long y = 0; y < {oh}; ++y) {{\n");
                s += &format!(
                    "            long long ih = y * {} - {} + q2 * {};\n            if (ih < 0 || ih >= {h}) continue;\n",
                    c.strides[0], c.pads[0], c.dilations[0]
                );
                s += &format!("            for (long long x = 0; x < {ow}; ++x) {{\n                long long iw = x * {} - {} + q3 * {};\n                if (iw < 0 || iw >= {w}) continue;\n", c.strides[1], c.pads[1], c.dilations[1]);
                s += &format!(
                    "                acc += {} * {};\n            }}\n        }}\n    }}\n",
                    ld(&format!("in1[((b * {m} + q0) * {oh} + y) * {ow} + x]")),
                    ld(&format!("in0[((b * {ch} + ci) * {h} + ih) * {w} + iw]"))
                );
            }
            GradKind::MaxPool(p) => {
                // out: dx; in0: x [n, c, h, w]; in1: dy [n, c, oh, ow]
                let [_, _, h, w] = nchw(&self.inputs[0]);
                let [_, _, oh, ow] = nchw(&self.inputs[1]);
                let (kh, kw) = (p.kernel[0], p.kernel[1]);
                s += &format!("    unsigned long long plane = (q0 * {a1}ull + q1), xp = plane * {}ull;\n", h * w);
                s += &format!("    for (long long a = 0; a < {kh}; ++a) {{\n        long long th = q2 + {} - a;\n        if (th < 0 || th % {} != 0 || th / {} >= {oh}) continue;\n        long long y = th / {};\n", p.pads[0], p.strides[0], p.strides[0], p.strides[0]);
                s += &format!("        for (long long b = 0; b < {kw}; ++b) {{\n            long long tw = q3 + {} - b;\n            if (tw < 0 || tw % {} != 0 || tw / {} >= {ow}) continue;\n            long long z = tw / {};\n", p.pads[1], p.strides[1], p.strides[1], p.strides[1]);
                s += "            // The window's first maximum, in row-major order.\n            long long best = -1; float bv = 0.0f;\n";
                s += &format!("            for (long long u = 0; u < {kh}; ++u) {{\n                long long ih = y * {} - {} + u;\n                if (ih < 0 || ih >= {h}) continue;\n", p.strides[0], p.pads[0]);
                s += &format!("                for (long long v = 0; v < {kw}; ++v) {{\n                    long long iw = z * {} - {} + v;\n                    if (iw < 0 || iw >= {w}) continue;\n", p.strides[1], p.pads[1]);
                s += &format!("                    float xv = {};\n                    if (best < 0 || xv > bv) {{ best = ih * {w} + iw; bv = xv; }}\n                }}\n            }}\n", ld(&format!("in0[xp + ih * {w} + iw]")));
                s += &format!(
                    "            if (best == q2 * {w} + q3) acc += {};\n        }}\n    }}\n",
                    ld(&format!("in1[plane * {}ull + y * {ow} + z]", oh * ow))
                );
            }
            GradKind::AvgPool(p, include_pad) => {
                // out: dx [n, c, h, w]; in0: dy [n, c, oh, ow]
                let [_, _, oh, ow] = nchw(&self.inputs[0]);
                let (h, w) = (a2, a3);
                let (kh, kw) = (p.kernel[0], p.kernel[1]);
                s += &format!("    unsigned long long plane = (q0 * {a1}ull + q1) * {}ull;\n", oh * ow);
                s += &format!("    for (long long a = 0; a < {kh}; ++a) {{\n        long long th = q2 + {} - a;\n        if (th < 0 || th % {} != 0 || th / {} >= {oh}) continue;\n        long long y = th / {};\n", p.pads[0], p.strides[0], p.strides[0], p.strides[0]);
                s += &format!("        for (long long b = 0; b < {kw}; ++b) {{\n            long long tw = q3 + {} - b;\n            if (tw < 0 || tw % {} != 0 || tw / {} >= {ow}) continue;\n            long long z = tw / {};\n", p.pads[1], p.strides[1], p.strides[1], p.strides[1]);
                let (sh, sw) = (format!("y * {} - {}", p.strides[0], p.pads[0]), format!("z * {} - {}", p.strides[1], p.pads[1]));
                if *include_pad {
                    s += &format!("            float div = (float)max(min({sh} + {kh}, (long long){}) - ({sh}), 1ll) * (float)max(min({sw} + {kw}, (long long){}) - ({sw}), 1ll);\n", h + p.pads[2], w + p.pads[3]);
                } else {
                    s += &format!("            long long ch = min({sh} + {kh}, (long long){h}) - max({sh}, 0ll);\n            long long cw = min({sw} + {kw}, (long long){w}) - max({sw}, 0ll);\n            float div = (float)max(ch * cw, 1ll);\n");
                }
                s += &format!("            acc += {} / div;\n        }}\n    }}\n", ld(&format!("in0[plane + y * {ow} + z]")));
            }
            GradKind::Gather { .. } => unreachable!("handled above"),
            GradKind::Lrn(smelt_ir::Lrn { size, alpha, beta, bias }) => {
                // out: dx; in0: x [n, c, h, w]; in1: dy
                let c = a1;
                let inner = a2 * a3;
                let (lo, hi) = ((size - 1) / 2, size / 2);
                let k = crate::c_f32(alpha / *size as f32);
                s += &format!("    unsigned long long base = q0 * {}ull + q2 * {a3}ull + q3;\n", c * inner);
                s += &format!("    #define AT(ch) (base + (unsigned long long)(ch) * {inner}ull)\n");
                s += &format!(
                    "    float sj = 0.0f;\n    for (long long k = max(q1 - {lo}, 0ll); k <= min(q1 + {hi}, {}ll); ++k) {{ float v = {}; sj += v * v; }}\n",
                    c - 1,
                    ld("in0[AT(k)]")
                );
                s += &format!("    sj = {} + {k} * sj;\n", crate::c_f32(*bias));
                s += &format!(
                    "    float sum = 0.0f;\n    for (long long ii = max(q1 - {hi}, 0ll); ii <= min(q1 + {lo}, {}ll); ++ii) {{\n",
                    c - 1
                );
                s += &format!(
                    "        float si = 0.0f;\n        for (long long k = max(ii - {lo}, 0ll); k <= min(ii + {hi}, {}ll); ++k) {{ float v = {}; si += v * v; }}\n",
                    c - 1,
                    ld("in0[AT(k)]")
                );
                s += &format!("        si = {} + {k} * si;\n", crate::c_f32(*bias));
                s += &format!(
                    "        sum += {} * {} * powf(si, {});\n    }}\n",
                    ld("in1[AT(ii)]"),
                    ld("in0[AT(ii)]"),
                    crate::c_f32(-beta - 1.0)
                );
                s += &format!(
                    "    acc = {} * powf(sj, {}) - {} * {} * sum;\n    #undef AT\n",
                    ld("in1[AT(q1)]"),
                    crate::c_f32(-beta),
                    crate::c_f32(2.0 * alpha * beta / *size as f32),
                    ld("in0[AT(q1)]")
                );
            }
        }
        s += &format!("    out[i] = {store}(acc);\n}}\n");
        s
    }

    /// (outer, indexed extent, inner) of a gather's data.
    fn gather_dims(&self, axis: usize) -> (usize, usize, usize) {
        let s = &self.output;
        (s[..axis].iter().product(), s[axis], s[axis + 1..].iter().product())
    }

    /// The data gradient, element by element as the CUDA kernel sums it
    /// (output channel, then kernel row, then column), with the taps that
    /// cover an element found once per element rather than per channel.
    fn conv_data_cpu(&self, c: &ConvAttrs, dy: &[f32], w: &[f32], out: &mut [f32]) {
        let [_, a1, a2, a3] = nchw(&self.output);
        let [_, m, oh, ow] = nchw(&self.inputs[0]);
        let [_, cg, kh, kw] = nchw(&self.inputs[1]);
        let mg = m / c.group;
        let covers = |q: usize, a: usize, pad: usize, stride: usize, out: usize| -> Option<usize> {
            let t = (q + pad).checked_sub(a)?;
            (t % stride == 0 && t / stride < out).then_some(t / stride)
        };
        par_fill(out, mg * kh * kw, |start, out| {
            let mut rows: Vec<(usize, usize)> = Vec::with_capacity(kh);
            let mut cols: Vec<(usize, usize)> = Vec::with_capacity(kw);
            for (i, o) in out.iter_mut().enumerate() {
                let i = start + i;
                let (q3, q2, q1, q0) = (i % a3, (i / a3) % a2, (i / (a2 * a3)) % a1, i / (a1 * a2 * a3));
                rows.clear();
                rows.extend((0..kh).filter_map(|a| covers(q2, a * c.dilations[0], c.pads[0], c.strides[0], oh).map(|y| (a, y))));
                cols.clear();
                cols.extend((0..kw).filter_map(|b| covers(q3, b * c.dilations[1], c.pads[1], c.strides[1], ow).map(|z| (b, z))));
                let (g, cl) = (q1 / cg, q1 % cg);
                let mut acc = 0f32;
                for mm in 0..mg {
                    let m_ = g * mg + mm;
                    let (dy_plane, w_plane) = ((q0 * m + m_) * oh, (m_ * cg + cl) * kh);
                    for &(a, y) in &rows {
                        let (dy_row, w_row) = ((dy_plane + y) * ow, (w_plane + a) * kw);
                        for &(b, z) in &cols {
                            acc += dy[dy_row + z] * w[w_row + b];
                        }
                    }
                }
                *o = acc;
            }
        });
    }

    /// The weight gradient, element by element as the CUDA kernel sums it
    /// (sample, then output row, then column), visiting only the output
    /// positions whose tap falls inside the input.
    fn conv_weight_cpu(&self, c: &ConvAttrs, x: &[f32], dy: &[f32], out: &mut [f32]) {
        let [_, a1, a2, a3] = nchw(&self.output);
        let [n, ch, h, w] = nchw(&self.inputs[0]);
        let [_, m, oh, ow] = nchw(&self.inputs[1]);
        let (cg, mg) = (ch / c.group, m / c.group);
        let (sh, sw) = (c.strides[0], c.strides[1]);
        let slices = self.slices();
        // The outputs o in 0..len whose input position o * stride + off - pad is in 0..size.
        let range = |off: usize, pad: usize, stride: usize, len: usize, size: usize| -> (usize, usize) {
            let lo = pad.saturating_sub(off).div_ceil(stride);
            let hi = if size + pad > off { ((size + pad - off - 1) / stride + 1).min(len) } else { 0 };
            (lo, hi.max(lo))
        };
        par_fill(out, n * oh * ow, |start, out| {
            for (i, o) in out.iter_mut().enumerate() {
                let i = start + i;
                let (q3, q2, q1, q0) = (i % a3, (i / a3) % a2, (i / (a2 * a3)) % a1, i / (a1 * a2 * a3));
                let ci = (q0 / mg) * cg + q1;
                let (offh, offw) = (q2 * c.dilations[0], q3 * c.dilations[1]);
                let (y0, y1) = range(offh, c.pads[0], sh, oh, h);
                let (x0, x1) = range(offw, c.pads[1], sw, ow, w);
                // The sum's KSTEP-long chunks of k = (b, y, x), dealt
                // round-robin to the kernel's slices, added in order at the end.
                let mut part = vec![0f32; slices];
                for b in 0..n {
                    let (dy_plane, x_plane) = ((b * m + q0) * oh, (b * ch + ci) * h);
                    for y in y0..y1 {
                        let ih = y * sh + offh - c.pads[0];
                        let dy_row = &dy[(dy_plane + y) * ow..][..ow];
                        let x_row = &x[(x_plane + ih) * w..][..w];
                        let k_row = (b * oh + y) * ow;
                        let mut xo = x0;
                        while xo < x1 {
                            let k = k_row + xo;
                            let end = x1.min(xo + KSTEP - k % KSTEP);
                            let acc = &mut part[k / KSTEP % slices];
                            for xo in xo..end {
                                *acc += dy_row[xo] * x_row[xo * sw + offw - c.pads[1]];
                            }
                            xo = end;
                        }
                    }
                }
                *o = part[1..].iter().fold(part[0], |a, b| a + b);
            }
        });
    }

    /// Runs the description on the CPU exactly as the kernel does.
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        if let GradKind::Gather { axis, .. } = &self.kind {
            let (_, dim, inner) = self.gather_dims(*axis);
            let idx = inputs[0].to_i64_vec();
            let dy = inputs[1].to_f32_vec();
            let m = idx.len();
            let out = (0..self.numel())
                .map(|i| {
                    let (c, j, o) = (i % inner, (i / inner) % dim, i / (dim * inner));
                    let mut acc = 0f32;
                    for (k, &x) in idx.iter().enumerate() {
                        let x = if x < 0 { x + dim as i64 } else { x };
                        if x == j as i64 {
                            acc += dy[(o * m + k) * inner + c];
                        }
                    }
                    acc
                })
                .collect();
            return Tensor::from_f32(self.output.clone(), out).cast(self.dtype);
        }
        // TF32 products: both operands rounded as the kernel rounds them.
        let round = |v: Vec<f32>| if self.tf32 { v.into_iter().map(smelt_ir::round_tf32).collect() } else { v };
        let ins: Vec<Vec<f32>> = inputs.iter().map(|t| round(t.to_f32_vec())).collect();
        let [_, a1, a2, a3] = nchw(&self.output);
        let mut out = vec![0f32; self.numel()];
        let (n0, n1) = (ins[0].as_slice(), ins.get(1).map_or(&[][..], |v| v.as_slice()));
        match &self.kind {
            GradKind::ConvData(c) => {
                self.conv_data_cpu(c, n0, n1, &mut out);
                return Tensor::from_f32(self.output.clone(), out).cast(self.dtype);
            }
            GradKind::ConvWeight(c) => {
                self.conv_weight_cpu(c, n0, n1, &mut out);
                return Tensor::from_f32(self.output.clone(), out).cast(self.dtype);
            }
            _ => {}
        }
        // Which output of a window over `len` elements (stride, pad) covers element q at offset a.
        let covers = |q: usize, a: usize, pad: usize, stride: usize, out: usize| -> Option<usize> {
            let t = (q + pad).checked_sub(a)?;
            (t % stride == 0 && t / stride < out).then_some(t / stride)
        };
        for (i, o) in out.iter_mut().enumerate() {
            let (q3, q2, q1, q0) = (i % a3, (i / a3) % a2, (i / (a2 * a3)) % a1, i / (a1 * a2 * a3));
            let mut acc = 0f32;
            match &self.kind {
                GradKind::ConvData(_) => unreachable!("handled above"),
                GradKind::ConvWeight(_) => unreachable!("handled above"),
                GradKind::MaxPool(p) => {
                    let [_, _, h, w] = nchw(&self.inputs[0]);
                    let [_, _, oh, ow] = nchw(&self.inputs[1]);
                    let plane = q0 * a1 + q1;
                    let x = &n0[plane * h * w..][..h * w];
                    for a in 0..p.kernel[0] {
                        let Some(y) = covers(q2, a, p.pads[0], p.strides[0], oh) else { continue };
                        for b in 0..p.kernel[1] {
                            let Some(z) = covers(q3, b, p.pads[1], p.strides[1], ow) else { continue };
                            let mut best: Option<(usize, f32)> = None;
                            for u in 0..p.kernel[0] {
                                let Some(ih) = (y * p.strides[0] + u).checked_sub(p.pads[0]).filter(|&v| v < h) else { continue };
                                for v in 0..p.kernel[1] {
                                    let Some(iw) = (z * p.strides[1] + v).checked_sub(p.pads[1]).filter(|&v| v < w) else { continue };
                                    let xv = x[ih * w + iw];
                                    if best.is_none_or(|(_, bv)| xv > bv) {
                                        best = Some((ih * w + iw, xv));
                                    }
                                }
                            }
                            if best.map(|b| b.0) == Some(q2 * w + q3) {
                                acc += n1[plane * oh * ow + y * ow + z];
                            }
                        }
                    }
                }
                GradKind::AvgPool(p, include_pad) => {
                    let [_, _, oh, ow] = nchw(&self.inputs[0]);
                    let (h, w) = (a2 as i64, a3 as i64);
                    let plane = (q0 * a1 + q1) * oh * ow;
                    let (kh, kw) = (p.kernel[0] as i64, p.kernel[1] as i64);
                    for a in 0..p.kernel[0] {
                        let Some(y) = covers(q2, a, p.pads[0], p.strides[0], oh) else { continue };
                        for b in 0..p.kernel[1] {
                            let Some(z) = covers(q3, b, p.pads[1], p.strides[1], ow) else { continue };
                            let sh = (y * p.strides[0]) as i64 - p.pads[0] as i64;
                            let sw = (z * p.strides[1]) as i64 - p.pads[1] as i64;
                            let div = if *include_pad {
                                ((sh + kh).min(h + p.pads[2] as i64) - sh).max(1) as f32
                                    * ((sw + kw).min(w + p.pads[3] as i64) - sw).max(1) as f32
                            } else {
                                (((sh + kh).min(h) - sh.max(0)) * ((sw + kw).min(w) - sw.max(0))).max(1) as f32
                            };
                            acc += n0[plane + y * ow + z] / div;
                        }
                    }
                }
                GradKind::Gather { .. } => unreachable!("handled above"),
                GradKind::Lrn(smelt_ir::Lrn { size, alpha, beta, bias }) => {
                    let (c, inner) = (a1, a2 * a3);
                    let (lo, hi) = ((size - 1) / 2, size / 2);
                    let k = alpha / *size as f32;
                    let base = q0 * c * inner + q2 * a3 + q3;
                    let at = |ch: usize| base + ch * inner;
                    let s = |j: usize| bias + k * (j.saturating_sub(lo)..=(j + hi).min(c - 1)).map(|m| n0[at(m)] * n0[at(m)]).sum::<f32>();
                    let sum: f32 =
                        (q1.saturating_sub(hi)..=(q1 + lo).min(c - 1)).map(|ii| n1[at(ii)] * n0[at(ii)] * s(ii).powf(-beta - 1.0)).sum();
                    acc = n1[at(q1)] * s(q1).powf(-beta) - 2.0 * alpha * beta / *size as f32 * n0[at(q1)] * sum;
                }
            }
            *o = acc;
        }
        Tensor::from_f32(self.output.clone(), out).cast(self.dtype)
    }
}
