//! Convolution kernels as data, with the fused epilogue
//! `act(conv(x, w) + bias + residual)` applied in registers.
//!
//! Two algorithms:
//! - [`Algo::ImplicitGemm`]: per group, the output `[M/g, N*OH*OW]` is the
//!   product of the weights `[M/g, K]` and the never-materialised im2col
//!   matrix `[K, N*OH*OW]`, `K = C/g * KH * KW`. A block of 256 threads
//!   computes a 64x64 output tile through 16-deep shared-memory tiles, each
//!   thread a 4x4 micro-tile in registers; the im2col element is decoded
//!   from (k, p) while the tile is loaded, padding read as zero.
//! - [`Algo::TensorCore`]: the same implicit GEMM on tensor cores, for f16
//!   and bf16 (and f32 in TF32 unless `--tf32 off`: 16x16x8 fragments,
//!   each operand rounded to TF32 once loaded): a block of warps computes
//!   a [`Tile`] chosen per kernel by the roofline model, each warp its part
//!   as `wmma` 16x16 products with f32 accumulators, fed from 16-deep
//!   shared-memory tiles of the operands' own type (no conversion on
//!   load); the accumulators go through shared memory to the epilogue, so
//!   stores are coalesced. Where the program keeps an activation
//!   channels-last (between tensor-core convs:
//!   [`crate::program::Program::build`] chooses), x is read `[N, H, W, C]`
//!   with the weights permuted to `[M, KH, KW, C/g]` in the blob, so both
//!   operands are k-contiguous and load 16 bytes at a time, and the output
//!   is written `[N, OH, OW, M]`, channels fastest. Where both operands
//!   load 16 bytes at a time, their tiles are double-buffered: step k+1's
//!   copied by `cp.async` while step k's products run.
//! - [`Algo::Direct`]: one thread per output element walking its window;
//!   for depthwise and other convs whose groups have too few output
//!   channels to fill a GEMM tile.
//!
//! 1-D convolutions run as 2-D ones of height 1. The CPU runs the same
//! description: f32 accumulation in ascending k for each output, then bias,
//! residual and activation, as the kernel does.

use crate::gemm::act_c;
use crate::tile::{tensor_core_type, Staging, Tile};
use smelt_ir::{Act, DType, KernelGraph, KernelOp, NodeId, Op, Tensor};

/// Rows (output channels) of an implicit-GEMM block tile.
pub const BM: usize = 64;
/// Columns (output positions) of a block tile.
pub const BN: usize = 64;
/// Depth of a shared-memory tile.
pub const BK: usize = 16;
/// Threads per block of the implicit GEMM and the direct algorithm.
pub const THREADS: usize = 256;

/// How the convolution is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// Implicit GEMM with shared-memory tiles.
    ImplicitGemm,
    /// Implicit GEMM on tensor cores (`wmma`, f16 or bf16 operands).
    TensorCore,
    /// One thread per output element.
    Direct,
}

/// A convolution kernel (2-D, or 1-D as height 1), NCHW.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// A stable, readable name, e.g. `conv3x3_bias_relu_n1c64h56w56_m64`.
    pub name: String,
    /// Input `[N, C, H, W]`.
    pub input: [usize; 4],
    /// Output `[N, M, OH, OW]`.
    pub output: [usize; 4],
    /// Kernel extent (KH, KW).
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Leading pads (top, left); the trailing ones only shape the output.
    pub pads: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Groups.
    pub groups: usize,
    /// A bias `[M]` follows the weights.
    pub bias: bool,
    /// A residual of the output's shape comes last.
    pub residual: bool,
    /// The epilogue activation.
    pub act: Act,
    /// Element type of the weights, bias, residual and output (f32 accumulation).
    pub dtype: DType,
    /// Element type of x (another float type is converted as it is loaded).
    pub x_dtype: DType,
    /// The algorithm.
    pub algo: Algo,
    /// f32 operands on tensor cores in TF32 (rounded to 10 mantissa bits).
    pub tf32: bool,
    /// The block tile on tensor cores ([`Tile::SQUARE`] otherwise).
    pub tile: Tile,
    /// x is channels-last (`[N, H, W, C]` in memory) and the weights with
    /// it (`[M, KH, KW, C/groups]`, permuted when the weights blob is
    /// built): the GEMM's k runs over (r, q, ci), channels fastest. On
    /// tensor cores only; chosen by [`crate::program::Program::build`].
    pub x_nhwc: bool,
    /// The output and the residual are channels-last (`[N, OH, OW, M]`).
    pub out_nhwc: bool,
}

impl Conv {
    /// The description of node `id`, if it is a 1-D or 2-D (fused) convolution.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Conv> {
        let node = g.node(id);
        let (c, bias, residual, act) = match &node.op {
            KernelOp::Op(Op::Conv(c)) => (c, g.inputs_of(id).len() > 2, false, Act::None),
            KernelOp::FusedConv { conv, bias, residual, act } => (conv, *bias, *residual, *act),
            _ => return None,
        };
        let ins = g.inputs_of(id);
        let (x, w, out) = (&g.ty(ins[0]).shape, &g.ty(ins[1]).shape, &node.outputs[0]);
        let dtype = out.dtype;
        if !dtype.is_float() {
            return None;
        }
        let two = |v: &[usize], one: usize| -> Option<[usize; 2]> {
            match v.len() {
                1 => Some([one, v[0]]),
                2 => Some([v[0], v[1]]),
                _ => None,
            }
        };
        let sp = x.len().checked_sub(2)?;
        let [h, wd] = two(&x[2..], 1)?;
        let [oh, ow] = two(&out.shape[2..], 1)?;
        let kernel = two(&w[2..], 1)?;
        let strides = two(&c.strides, 1)?;
        let pads = two(&c.pads[..sp], 0)?;
        let dilations = two(&c.dilations, 1)?;
        let input = [x[0], x[1], h, wd];
        let output = [out.shape[0], out.shape[1], oh, ow];
        let groups = c.group.max(1);
        let mg = output[1] / groups;
        let x_dtype = g.ty(ins[0]).dtype;
        let algo = if mg < 8 {
            Algo::Direct
        } else if (tensor_core_type(dtype) || (dtype == DType::F32 && g.tf32().convs())) && x_dtype == dtype {
            Algo::TensorCore
        } else {
            Algo::ImplicitGemm
        };
        let mut name = format!("conv{}x{}", kernel[0], kernel[1]);
        if strides != [1, 1] {
            name += &format!("_s{}", strides[0].max(strides[1]));
        }
        if dilations != [1, 1] {
            name += &format!("_d{}", dilations[0].max(dilations[1]));
        }
        if groups > 1 {
            name += &if groups == input[1] && groups == output[1] { "_dw".to_string() } else { format!("_g{groups}") };
        }
        // Pads other than "same" for a stride-1 window are spelled out.
        let same = (0..2).all(|d| pads[d] == (kernel[d] - 1) * dilations[d] / 2);
        if !same {
            name += &format!("_p{}", pads[0].max(pads[1]));
        }
        if bias {
            name += "_bias";
        }
        if residual {
            name += "_res";
        }
        if act != Act::None {
            name += &format!("_{}", act.to_string().split('(').next().unwrap_or("act"));
        }
        name += &format!("_n{}c{}h{}w{}_m{}", input[0], input[1], input[2], input[3], output[1]);
        if dtype != DType::F32 {
            name += &format!("_{dtype}");
        }
        if !x_dtype.is_float() {
            return None;
        }
        if x_dtype != dtype {
            name += &format!("_x{x_dtype}");
        }
        let tf32 = algo == Algo::TensorCore && dtype == DType::F32;
        if tf32 {
            name += "_tf32";
        }
        let conv = Conv {
            name,
            input,
            output,
            kernel,
            strides,
            pads,
            dilations,
            groups,
            bias,
            residual,
            act,
            dtype,
            x_dtype,
            algo,
            tf32,
            tile: Tile::SQUARE,
            x_nhwc: false,
            out_nhwc: false,
        };
        Some(conv)
    }

    /// The same kernel reading x (and its weights) and writing its output
    /// (and reading the residual) channels-last where `x` and `out` say;
    /// its name says which (`_nhwc`, `_to_nhwc`, `_to_nchw`).
    pub fn channels_last(mut self, x: bool, out: bool) -> Conv {
        debug_assert!(self.algo == Algo::TensorCore || !(x || out), "channels-last on tensor cores only");
        self.x_nhwc = x;
        self.out_nhwc = out;
        self.name += self.layout_suffix();
        self
    }

    /// What its name says of its layouts (see [`Conv::channels_last`]).
    pub fn layout_suffix(&self) -> &'static str {
        match (self.x_nhwc, self.out_nhwc) {
            (true, true) => "_nhwc",
            (false, true) => "_to_nhwc",
            (true, false) => "_to_nchw",
            (false, false) => "",
        }
    }

    /// Elements of a 16-byte vector of the operands.
    fn vector(&self) -> usize {
        16 / self.dtype.size()
    }

    /// Whether the tensor-core tiles load the weights and x 16 bytes at a
    /// time: the weights where each row (k elements) is whole vectors; x
    /// where it is channels-last and every group's channels are whole
    /// vectors (a vector of k never crosses a window tap).
    pub fn vector_loads(&self) -> (bool, bool) {
        let v = self.vector();
        let tc = self.algo == Algo::TensorCore;
        (tc && self.k().is_multiple_of(v), tc && self.x_nhwc && self.cg().is_multiple_of(v) && self.input[1].is_multiple_of(v))
    }

    /// Whether the tensor-core tiles are double-buffered, the next step's
    /// copied by `cp.async` while this step's products run: where both
    /// operands load 16 bytes at a time (channels-last x).
    pub fn pipelined(&self) -> bool {
        self.vector_loads() == (true, true)
    }

    /// Input channels per group.
    pub fn cg(&self) -> usize {
        self.input[1] / self.groups
    }

    /// Output channels per group.
    pub fn mg(&self) -> usize {
        self.output[1] / self.groups
    }

    /// The GEMM depth: `C/g * KH * KW`.
    pub fn k(&self) -> usize {
        self.cg() * self.kernel[0] * self.kernel[1]
    }

    /// The GEMM width: `N * OH * OW`.
    pub fn p(&self) -> usize {
        self.output[0] * self.output[2] * self.output[3]
    }

    /// Output elements.
    pub fn numel(&self) -> usize {
        self.output.iter().product()
    }

    /// Multiply-adds.
    pub fn macs(&self) -> usize {
        self.numel() * self.k()
    }

    /// Launch geometry: grid (x, y, z) of blocks of [`THREADS`] threads.
    pub fn grid(&self) -> [usize; 3] {
        match self.algo {
            Algo::ImplicitGemm => [self.p().div_ceil(BN), self.mg().div_ceil(BM), self.groups],
            Algo::TensorCore => [self.p().div_ceil(self.tile.n), self.mg().div_ceil(self.tile.m), self.groups],
            Algo::Direct => [self.numel().div_ceil(THREADS), 1, 1],
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> usize {
        match self.algo {
            Algo::TensorCore => self.tile.threads(),
            Algo::ImplicitGemm | Algo::Direct => THREADS,
        }
    }

    /// The kernel's parameters, in order.
    pub fn params(&self) -> Vec<&'static str> {
        let mut p = vec!["x", "w"];
        if self.bias {
            p.push("bias");
        }
        if self.residual {
            p.push("residual");
        }
        p.push("out");
        p
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(x, w, [bias,] [residual,] out)`.
    pub fn cuda(&self) -> String {
        let (ty, load, store) = crate::c_type(self.dtype);
        let (xty, xload, _) = crate::c_type(self.x_dtype);
        let [n, c, h, w] = self.input;
        let [_, m, oh, ow] = self.output;
        let ([kh, kw], [sh, sw], [ph, pw], [dh, dw]) = (self.kernel, self.strides, self.pads, self.dilations);
        let (cg, mg, k, p) = (self.cg(), self.mg(), self.k(), self.p());
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        if self.algo == Algo::TensorCore {
            s += "#include <mma.h>\n";
            if self.pipelined() {
                s += "#include <cuda_pipeline.h>\n";
            }
            s += "using namespace nvcuda;\n";
        }
        s += "\n";
        s += &format!(
            "// {}: act={} (conv{kh}x{kw} stride {sh}x{sw} pad {ph}x{pw} dilation {dh}x{dw} groups {} of x[{n},{c},{h},{w}]{}{}) -> [{n},{m},{oh},{ow}], {:?}\n",
            self.name,
            self.act,
            self.groups,
            if self.bias { " + bias" } else { "" },
            if self.residual { " + residual" } else { "" },
            self.algo,
        );
        let (wvec, xvec) = self.vector_loads();
        let vec_or = |vector: bool, t: &str| if vector { "uint4".to_string() } else { t.to_string() };
        let mut params =
            vec![format!("const {}* __restrict__ x", vec_or(xvec, xty)), format!("const {}* __restrict__ w", vec_or(wvec, ty))];
        if self.bias {
            params.push(format!("const {ty}* __restrict__ bias"));
        }
        if self.residual {
            params.push(format!("const {ty}* residual"));
        }
        // No `__restrict__` on the residual and the output: the plan may
        // make them the same bytes (in place).
        params.push(format!("{ty}* out"));
        // No __launch_bounds__: with it, ptxas for sm_90 trades registers for
        // occupancy and spills the f16 variants (4 bytes at 48 registers);
        // without it none spills (measured with --ptxas-stats). Launched
        // with THREADS threads per block.
        s += &format!("extern \"C\" __global__ void {}({}) {{\n", self.name, params.join(", "));
        // The epilogue for output channel `co` at flat output index `o`.
        let epilogue = |indent: &str, acc: &str| {
            let mut e = format!("{indent}float v = {acc};\n");
            if self.bias {
                e += &format!("{indent}v += {load}(bias[co]);\n");
            }
            if self.residual {
                e += &format!("{indent}v += {load}(residual[o]);\n");
            }
            if self.act != Act::None {
                e += &format!("{indent}v = {};\n", act_c(self.act, "v"));
            }
            e += &format!("{indent}out[o] = {store}(v);\n");
            e
        };
        // One BK x BN tile of im2col(x) into shared `bs` by `threads`
        // threads, each element of type `vt` (`zero` in the padding) read
        // through `conv`.
        let im2col_tile = |threads: usize, bn: usize, vt: &str, zero: &str, conv: &str| {
            let mut t = format!("        #pragma unroll\n        for (int i = tid; i < {}; i += {threads}) {{\n", BK * bn);
            t += &format!("            int kk = i / {bn}, pp = i % {bn}, gk = k0 + kk, gp = p0 + pp;\n            {vt} v = {zero};\n");
            t += &format!("            if (gk < {k} && gp < {p}) {{\n");
            t += &format!("                int ci = gk / {}, r = gk / {kw} % {kh}, q = gk % {kw};\n", kh * kw);
            t += &format!("                int nb = gp / {}, oy = gp / {ow} % {oh}, ox = gp % {ow};\n", oh * ow);
            t += &format!("                int iy = oy * {sh} - {ph} + r * {dh}, ix = ox * {sw} - {pw} + q * {dw};\n");
            t += &format!(
                "                if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) v = {conv}(x[(((unsigned long long)nb * {c} + g * {cg} + ci) * {h} + iy) * {w} + ix]);\n            }}\n"
            );
            t + "            bs[kk][pp] = v;\n        }\n        __syncthreads();\n"
        };
        // A GEMM tile's result at output channel `co`, image position `gp`:
        // its flat index `o`, then the epilogue.
        let tile_epilogue = |indent: &str, acc: &str| {
            let hw = oh * ow;
            let o = if self.out_nhwc {
                format!("{indent}unsigned long long o = (unsigned long long)gp * {m} + co;\n")
            } else {
                format!("{indent}unsigned long long o = ((unsigned long long)(gp / {hw}) * {m} + co) * {hw} + gp % {hw};\n")
            };
            o + &epilogue(indent, acc)
        };
        match self.algo {
            Algo::Direct => {
                s += &format!(
                    "    unsigned long long o = (unsigned long long)blockIdx.x * {THREADS} + threadIdx.x;\n    if (o >= {}ull) return;\n",
                    self.numel()
                );
                s += &format!("    int ox = (int)(o % {ow}ull), oy = (int)(o / {ow}ull % {oh}ull);\n");
                s += &format!("    int co = (int)(o / {}ull % {m}ull), nb = (int)(o / {}ull);\n", oh * ow, m * oh * ow);
                s += &format!(
                    "    int gc = co / {mg} * {cg};\n    unsigned long long wr = (unsigned long long)co * {k};\n    float acc = 0.0f;\n"
                );
                s += &format!("    for (int ci = 0; ci < {cg}; ++ci) {{\n");
                s += &format!("        unsigned long long xc = ((unsigned long long)nb * {c} + gc + ci) * {};\n", h * w);
                s += &format!("        #pragma unroll\n        for (int r = 0; r < {kh}; ++r) {{\n            int iy = oy * {sh} - {ph} + r * {dh};\n            if (iy < 0 || iy >= {h}) continue;\n");
                s += &format!("            #pragma unroll\n            for (int q = 0; q < {kw}; ++q) {{\n                int ix = ox * {sw} - {pw} + q * {dw};\n                if (ix < 0 || ix >= {w}) continue;\n");
                s += &format!("                acc += {xload}(x[xc + iy * {w} + ix]) * {load}(w[wr + (ci * {kh} + r) * {kw} + q]);\n            }}\n        }}\n    }}\n");
                s += &epilogue("    ", "acc");
            }
            Algo::ImplicitGemm => {
                s += &format!("    // A = w[{mg} x {k}] per group, B = im2col(x)[{k} x {p}], 4x4 outputs per thread.\n");
                s += &format!("    __shared__ float as[{BK}][{}];\n    __shared__ float bs[{BK}][{BN}];\n", BM + 1);
                s += "    const int tid = threadIdx.x, tm = tid / 16, tn = tid % 16;\n";
                s += &format!("    const int g = blockIdx.z, m0 = blockIdx.y * {BM}, p0 = blockIdx.x * {BN};\n");
                s += &format!("    const unsigned long long wg = (unsigned long long)g * {mg} * {k};\n");
                s += "    float acc[4][4];\n    #pragma unroll\n    for (int i = 0; i < 4; ++i)\n        #pragma unroll\n        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;\n";
                s += &format!("    for (int k0 = 0; k0 < {k}; k0 += {BK}) {{\n");
                s += &format!("        #pragma unroll\n        for (int i = tid; i < {}; i += {THREADS}) {{\n", BM * BK);
                s += &format!("            int mm = i / {BK}, kk = i % {BK}, gm = m0 + mm, gk = k0 + kk;\n");
                s += &format!("            as[kk][mm] = (gm < {mg} && gk < {k}) ? {load}(w[wg + (unsigned long long)gm * {k} + gk]) : 0.0f;\n        }}\n");
                s += &im2col_tile(THREADS, BN, "float", "0.0f", xload);
                s += &format!("        #pragma unroll\n        for (int kk = 0; kk < {BK}; ++kk) {{\n");
                s += "            float a[4], b[4];\n            #pragma unroll\n            for (int i = 0; i < 4; ++i) a[i] = as[kk][tm + 16 * i];\n";
                s += "            #pragma unroll\n            for (int j = 0; j < 4; ++j) b[j] = bs[kk][tn + 16 * j];\n";
                s += "            #pragma unroll\n            for (int i = 0; i < 4; ++i)\n                #pragma unroll\n                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];\n";
                s += "        }\n        __syncthreads();\n    }\n";
                s += "    #pragma unroll\n    for (int i = 0; i < 4; ++i) {\n        int gm = m0 + tm + 16 * i;\n";
                s += &format!("        if (gm >= {mg}) continue;\n        int co = g * {mg} + gm;\n");
                s += "        #pragma unroll\n        for (int j = 0; j < 4; ++j) {\n            int gp = p0 + tn + 16 * j;\n";
                s += &format!("            if (gp >= {p}) continue;\n");
                s += &tile_epilogue("            ", "acc[i][j]");
                s += "        }\n    }\n";
            }
            Algo::TensorCore => {
                let t = self.tile;
                let pipelined = self.pipelined();
                let st = Staging { b_kmajor: self.x_nhwc, c_colmajor: self.out_nhwc, pipelined };
                let (lda, ldb, _) = t.lds(st);
                let [fm, fn_] = t.frags();
                let (threads, v) = (t.threads(), self.vector());
                let f = crate::gemm::Fragments::of(self.dtype);
                let layout = |nhwc: bool| if nhwc { "NHWC" } else { "NCHW" };
                s += &format!(
                    "    // A = w[{mg} x {k}] per group, B = im2col(x)[{k} x {p}] in {ty} (x {}, out {}); {}x{} tiles, {} warps, each {fm}x{fn_} wmma {} products (f32 accumulators){}.\n",
                    layout(self.x_nhwc),
                    layout(self.out_nhwc),
                    t.m,
                    t.n,
                    threads / 32,
                    f.what(),
                    if pipelined { "; operand tiles in two stages, the next filled by cp.async during the products" } else { "" }
                );
                s += &t.declare(ty, self.dtype.size(), st);
                s += &format!("    const int g = blockIdx.z, m0 = blockIdx.y * {}, p0 = blockIdx.x * {};\n", t.m, t.n);
                s += &format!("    const unsigned long long wg = (unsigned long long)g * {mg} * {k};\n");
                if !(wvec && xvec) {
                    s += &format!("    const {ty} zero = {store}(0.0f);\n");
                }
                if wvec || xvec {
                    s += "    const uint4 zero4 = {0u, 0u, 0u, 0u};\n";
                }
                s += &format!("    {} acc[{fm}][{fn_}];\n", f.accumulator());
                s += &format!("    #pragma unroll\n    for (int i = 0; i < {fm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {fn_}; ++j) wmma::fill_fragment(acc[i][j], 0.0f);\n");
                if pipelined {
                    // Stage `kt % 2` holds step kt's tiles; step kt + 1's are
                    // copied into the other while kt's products run.
                    let at = format!("(((unsigned long long)nb * {h} + iy) * {w} + ix) * {c} + g * {cg} + ci");
                    let load = |stage: &str, k0: &str| {
                        let mut l = t.stage(ty, self.dtype.size(), st, stage, ("an", "bn"));
                        l += &format!("#pragma unroll\nfor (int i = tid; i < {}; i += {threads}) {{\n", t.m * BK / v);
                        l += &format!("    int mm = i / {0}, kk = i % {0} * {v}, gm = m0 + mm, gk = {k0} + kk;\n", BK / v);
                        l += &format!("    if (gm < {mg} && gk < {k}) __pipeline_memcpy_async(&an[mm][kk], &w[(wg + (unsigned long long)gm * {k} + gk) / {v}], 16);\n");
                        l += "    else *reinterpret_cast<uint4*>(&an[mm][kk]) = zero4;\n}\n";
                        l += &format!("#pragma unroll\nfor (int i = tid; i < {}; i += {threads}) {{\n", BK * t.n / v);
                        l += &format!("    int pp = i / {0}, kk = i % {0} * {v}, gk = {k0} + kk, gp = p0 + pp;\n    bool inb = false;\n    unsigned long long at = 0;\n", BK / v);
                        l += &format!("    if (gk < {k} && gp < {p}) {{\n");
                        l += &format!("        int r = gk / {}, q = gk / {cg} % {kw}, ci = gk % {cg};\n", kw * cg);
                        l += &format!("        int nb = gp / {}, oy = gp / {ow} % {oh}, ox = gp % {ow};\n", oh * ow);
                        l += &format!("        int iy = oy * {sh} - {ph} + r * {dh}, ix = ox * {sw} - {pw} + q * {dw};\n");
                        l += &format!("        if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{\n            inb = true;\n            at = ({at}) / {v};\n        }}\n    }}\n");
                        l += "    if (inb) __pipeline_memcpy_async(&bn[pp][kk], &x[at], 16);\n    else *reinterpret_cast<uint4*>(&bn[pp][kk]) = zero4;\n}\n";
                        l
                    };
                    let steps = k.div_ceil(BK);
                    s += &format!("    {{\n{}    }}\n    __pipeline_commit();\n", crate::tile::indent(&load("0", "0"), "        "));
                    s += &format!("    for (int kt = 0; kt < {steps}; ++kt) {{\n");
                    s += &format!(
                        "        if (kt + 1 < {steps}) {{\n{}        }}\n",
                        crate::tile::indent(&load("(kt + 1) % 2", &format!("(kt + 1) * {BK}")), "            ")
                    );
                    s += "        __pipeline_commit();\n        __pipeline_wait_prior(1);\n        __syncthreads();\n";
                    s += &crate::tile::indent(&t.stage(ty, self.dtype.size(), st, "kt % 2", ("as", "bs")), "        ");
                    s += &f.products(BK, t.frags(), (lda, ldb), self.x_nhwc, "        ");
                    // Before the next step's copies overwrite this stage.
                    s += "        __syncthreads();\n    }\n";
                    let body =
                        format!("int gm = m0 + mm, gp = p0 + pp;\nif (gm >= {mg} || gp >= {p}) continue;\nint co = g * {mg} + gm;\n");
                    s += &t.epilogue(&(body + &tile_epilogue("", "cv")), st);
                    s += "}\n";
                    return s;
                }
                s += &format!("    for (int k0 = 0; k0 < {k}; k0 += {BK}) {{\n");
                if wvec {
                    // A row's 16 elements in whole vectors (k is whole vectors).
                    s += &format!("        #pragma unroll\n        for (int i = tid; i < {}; i += {threads}) {{\n", t.m * BK / v);
                    s += &format!("            int mm = i / {0}, kk = i % {0} * {v}, gm = m0 + mm, gk = k0 + kk;\n", BK / v);
                    s += &format!(
                        "            *reinterpret_cast<uint4*>(&as[mm][kk]) = (gm < {mg} && gk < {k}) ? w[(wg + (unsigned long long)gm * {k} + gk) / {v}] : zero4;\n        }}\n"
                    );
                } else {
                    s += &format!("        #pragma unroll\n        for (int i = tid; i < {}; i += {threads}) {{\n", t.m * BK);
                    s += &format!("            int mm = i / {BK}, kk = i % {BK}, gm = m0 + mm, gk = k0 + kk;\n");
                    s += &format!(
                        "            as[mm][kk] = (gm < {mg} && gk < {k}) ? w[wg + (unsigned long long)gm * {k} + gk] : zero;\n        }}\n"
                    );
                }
                if self.x_nhwc {
                    // Column pp of im2col(x): channels of one tap, contiguous
                    // in x, an element at a time (16-byte chunks pipeline).
                    s += &format!("        #pragma unroll\n        for (int i = tid; i < {}; i += {threads}) {{\n", BK * t.n);
                    s +=
                        &format!("            int pp = i / {BK}, kk = i % {BK}, gk = k0 + kk, gp = p0 + pp;\n            {ty} v = zero;\n");
                    s += &format!("            if (gk < {k} && gp < {p}) {{\n");
                    s += &format!("                int r = gk / {}, q = gk / {cg} % {kw}, ci = gk % {cg};\n", kw * cg);
                    s += &format!("                int nb = gp / {}, oy = gp / {ow} % {oh}, ox = gp % {ow};\n", oh * ow);
                    s += &format!("                int iy = oy * {sh} - {ph} + r * {dh}, ix = ox * {sw} - {pw} + q * {dw};\n");
                    s += &format!(
                        "                if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) v = x[(((unsigned long long)nb * {h} + iy) * {w} + ix) * {c} + g * {cg} + ci];\n            }}\n"
                    );
                    s += "            bs[pp][kk] = v;\n        }\n        __syncthreads();\n";
                } else {
                    s += &im2col_tile(threads, t.n, ty, "zero", "");
                }
                s += &f.products(BK, t.frags(), (lda, ldb), self.x_nhwc, "        ");
                s += "        __syncthreads();\n    }\n";
                let body = format!("int gm = m0 + mm, gp = p0 + pp;\nif (gm >= {mg} || gp >= {p}) continue;\nint co = g * {mg} + gm;\n");
                s += &t.epilogue(&(body + &tile_epilogue("", "cv")), st);
            }
        }
        s += "}\n";
        s
    }

    /// Whether it runs on tensor cores.
    pub fn tensor_cores(&self) -> bool {
        self.algo == Algo::TensorCore
    }

    /// Runs the description on the CPU as the kernel computes it: for each
    /// output, the products summed in f32 in ascending k (padding taps
    /// contribute nothing), then bias, residual and activation; the result
    /// rounded to the dtype. Channels-last operands and outputs are read
    /// and written in that layout (k then runs over (r, q, ci)).
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let tf32 = |v: Vec<f32>| if self.tf32 { v.into_iter().map(smelt_ir::round_tf32).collect() } else { v };
        let x = tf32(inputs[0].to_f32_vec());
        let w = tf32(inputs[1].to_f32_vec());
        let bias = self.bias.then(|| inputs[2].to_f32_vec());
        let residual = self.residual.then(|| inputs[inputs.len() - 1].to_f32_vec());
        let [_, c, h, wd] = self.input;
        let [_, m, oh, ow] = self.output;
        let ([kh, kw], [sh, sw], [ph, pw], [dh, dw]) = (self.kernel, self.strides, self.pads, self.dilations);
        let (cg, mg, k, p) = (self.cg(), self.mg(), self.k(), self.p());
        let plane = oh * ow;
        let mut out = vec![0f32; self.numel()];
        // Positions in blocks whose accumulators stay in the cache; each
        // output still sums its k products in order, one rounding each, so
        // the result does not depend on the block.
        const BLOCK: usize = 128;
        let mut row = vec![0f32; BLOCK];
        let mut corner = vec![(0usize, 0usize, 0usize); BLOCK];
        let mut acc = vec![0f32; mg * BLOCK];
        let mut wt = vec![0f32; k * mg];
        for g in 0..self.groups {
            // The group's weights as [k, mg]: one contiguous column per kk.
            for gm in 0..mg {
                for kk in 0..k {
                    wt[kk * mg + gm] = w[(g * mg + gm) * k + kk];
                }
            }
            for p0 in (0..p).step_by(BLOCK) {
                let pb = BLOCK.min(p - p0);
                acc[..mg * pb].fill(0.0);
                // Each position's image and window corner, decoded once.
                for (j, at) in corner[..pb].iter_mut().enumerate() {
                    let gp = p0 + j;
                    *at = (gp / plane, (gp / ow % oh) * sh, (gp % ow) * sw);
                }
                for kk in 0..k {
                    let (ci, r, q) =
                        if self.x_nhwc { (kk % cg, kk / (kw * cg), kk / cg % kw) } else { (kk / (kh * kw), kk / kw % kh, kk % kw) };
                    let (dy, dx) = (r * dh, q * dw);
                    // Row kk of the im2col matrix, as the kernel decodes it.
                    for (v, &(nb, y0, x0)) in row[..pb].iter_mut().zip(&corner[..pb]) {
                        let iy = (y0 + dy).checked_sub(ph).filter(|&i| i < h);
                        let ix = (x0 + dx).checked_sub(pw).filter(|&i| i < wd);
                        *v = match (iy, ix) {
                            (Some(iy), Some(ix)) if self.x_nhwc => x[((nb * h + iy) * wd + ix) * c + g * cg + ci],
                            (Some(iy), Some(ix)) => x[((nb * c + g * cg + ci) * h + iy) * wd + ix],
                            _ => 0.0,
                        };
                    }
                    for (gm, &a) in wt[kk * mg..][..mg].iter().enumerate() {
                        acc[gm * pb..][..pb].iter_mut().zip(&row[..pb]).for_each(|(acc, b)| *acc += a * b);
                    }
                }
                for gm in 0..mg {
                    let co = g * mg + gm;
                    for j in 0..pb {
                        let gp = p0 + j;
                        let o = if self.out_nhwc { gp * m + co } else { ((gp / plane) * m + co) * plane + gp % plane };
                        let mut v = acc[gm * pb + j];
                        if let Some(b) = &bias {
                            v += b[co];
                        }
                        if let Some(r) = &residual {
                            v += r[o];
                        }
                        out[o] = self.act.apply(v);
                    }
                }
            }
        }
        let shape = inputs[0].shape().len();
        let mut out_shape = if shape == 3 { vec![self.output[0], m, ow] } else { self.output.to_vec() };
        if self.out_nhwc {
            out_shape = channels_last_shape(&out_shape);
        }
        Tensor::from_f32(out_shape, out).cast(self.dtype)
    }
}

/// `shape` (`[N, C, ...]`) as a channels-last tensor holds it: `[N, ..., C]`.
pub fn channels_last_shape(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    if s.len() > 2 {
        s[1..].rotate_left(1);
    }
    s
}
