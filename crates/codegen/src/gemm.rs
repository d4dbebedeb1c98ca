//! GEMM kernels as data: `act(alpha * op(A) @ op(B) + beta * C)` with
//! 16x16 shared-memory tiles, one thread per output element, the bias and
//! activation applied in registers; or, for f16 and bf16 operands, on
//! tensor cores: a [`Tile`] per block chosen by the roofline model, each
//! warp's part as `wmma` products with f32 accumulators, the epilogue read
//! back from shared memory, operands loaded 16 bytes at a time where their
//! contiguous dim allows and then double-buffered by `cp.async`; batched (`MatMul` with numpy batch
//! broadcasting) over the grid's z dimension, each operand's batch offset
//! from its own strides, so a broadcast operand is never copied. The same
//! description renders to CUDA C and runs on the CPU.

use crate::elementwise::strides;
use crate::tile::Tile;
use smelt_ir::{Act, DType, Expr, KernelGraph, KernelOp, NodeId, Op, Tensor, TensorType};

/// The tile edge.
pub const TILE: usize = 16;

/// A GEMM kernel (Gemm, fused Gemm with an activation).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// A stable, readable name, e.g. `gemm_tb_relu_m1n4096k9216`.
    pub name: String,
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// B is stored transposed (`[n, k]`).
    pub trans_b: bool,
    /// Product scale.
    pub alpha: f32,
    /// Bias scale.
    pub beta: f32,
    /// The bias's strides in the `[m, n]` output (broadcast dims 0), if any.
    pub bias: Option<Vec<usize>>,
    /// The epilogue activation.
    pub act: Act,
    /// Element type of B, C and the output.
    pub dtype: DType,
    /// Element type of A (another float type is converted as it is loaded).
    pub a_dtype: DType,
    /// The output's batch dims (empty for a Gemm): one z block per matrix.
    pub batch: Vec<usize>,
    /// Per batch dim, A's and B's element strides (0 where broadcast).
    pub batch_strides: (Vec<usize>, Vec<usize>),
    /// The output shape.
    pub output: Vec<usize>,
    /// An elementwise expression applied to each result before it is
    /// stored (a `gemm_epilogue`), if any.
    pub epilogue: Option<Epilogue>,
    /// On tensor cores (A and B both f16, or both bf16, or both f32 in TF32).
    pub tensor_cores: bool,
    /// f32 operands on tensor cores in TF32 (`--tf32 on`).
    pub tf32: bool,
    /// The block tile on tensor cores ([`Tile::SQUARE`] otherwise).
    pub tile: Tile,
}

/// What a `gemm_epilogue` applies to each result: `expr` with `$0` the
/// result (f32, at its flat index in `shape`) and `$i` the kernel's
/// operand after a and b number `i - 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// The expression.
    pub expr: Expr,
    /// The output shape (the product's elements, read in this shape).
    pub shape: Vec<usize>,
    /// Per expression input (the product first): dtype and element
    /// strides in `shape`.
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// The output dtype.
    pub out: DType,
}

/// Most matrices in one batched launch (CUDA's grid z limit).
const MAX_BATCH: usize = 65_535;

impl Gemm {
    /// The description of node `id`, if it is a (fused) Gemm.
    pub fn of(g: &KernelGraph, id: NodeId) -> Option<Gemm> {
        let mut gemm = Gemm::of_node(g, id)?;
        if g.tf32().gemms() && gemm.dtype == DType::F32 && gemm.a_dtype == DType::F32 {
            gemm.tensor_cores = true;
            gemm.tf32 = true;
            gemm.name += "_tf32";
        }
        Some(gemm)
    }

    fn of_node(g: &KernelGraph, id: NodeId) -> Option<Gemm> {
        let node = g.node(id);
        let ins = g.inputs_of(id);
        let tys: Vec<&TensorType> = ins.iter().map(|v| g.ty(*v)).collect();
        if let KernelOp::GemmEpilogue { product, expr, shape } = &node.op {
            if !node.outputs[0].dtype.is_float() {
                return None;
            }
            let product = KernelOp::Op(product.op());
            let p = smelt_ir::infer_kernel(&product, &tys[..2]).ok()?.remove(0);
            let mut gemm = Gemm::describe(&product, &tys[..2], &p)?;
            let mut inputs = vec![(DType::F32, strides(shape, shape))];
            inputs.extend(tys[2..].iter().map(|t| (t.dtype, strides(&t.shape, shape))));
            gemm.name = format!("{}_epi{}", gemm.name, crate::elementwise::ops_tag(expr));
            gemm.epilogue = Some(Epilogue { expr: expr.clone(), shape: shape.clone(), inputs, out: node.outputs[0].dtype });
            return Some(gemm);
        }
        Gemm::describe(&node.op, &tys, &node.outputs[0])
    }

    /// The description of `op` (matmul, gemm, fused gemm) on operands of
    /// types `ins`, giving `out`.
    fn describe(op: &KernelOp, ins: &[&TensorType], out: &TensorType) -> Option<Gemm> {
        if let KernelOp::Op(Op::MatMul) = op {
            return Gemm::matmul(ins, out);
        }
        let (trans_a, trans_b, alpha, beta, act) = match *op {
            KernelOp::Op(Op::Gemm { trans_a, trans_b, alpha, beta }) => (trans_a, trans_b, alpha, beta, Act::None),
            KernelOp::FusedGemm { trans_a, trans_b, alpha, beta, act } => (trans_a, trans_b, alpha, beta, act),
            _ => return None,
        };
        let (m, n) = (out.shape[0], out.shape[1]);
        let a = ins[0];
        let k = if trans_a { a.shape[0] } else { a.shape[1] };
        let bias = ins.get(2).map(|c| strides(&c.shape, &out.shape));
        let act_tag = if act == Act::None { String::new() } else { format!("_{}", act.to_string().split('(').next().unwrap_or("act")) };
        let t = format!("{}{}", if trans_a { "_ta" } else { "" }, if trans_b { "_tb" } else { "" });
        let mut suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        if !a.dtype.is_float() || !out.dtype.is_float() {
            return None;
        }
        if a.dtype != out.dtype {
            suffix += &format!("_a{}", a.dtype);
        }
        let name = format!("gemm{t}{act_tag}_m{m}n{n}k{k}{suffix}");
        Some(Gemm {
            name,
            m,
            n,
            k,
            trans_a,
            trans_b,
            alpha,
            beta,
            bias,
            act,
            dtype: out.dtype,
            a_dtype: a.dtype,
            batch: Vec::new(),
            batch_strides: (Vec::new(), Vec::new()),
            output: vec![m, n],
            epilogue: None,
            tensor_cores: crate::tile::tensor_core_type(out.dtype) && a.dtype == out.dtype,
            tf32: false,
            tile: Tile::SQUARE,
        })
    }

    /// A batched matrix product with numpy semantics (a rank-1 operand is a
    /// row or a column vector).
    fn matmul(ins: &[&TensorType], out: &TensorType) -> Option<Gemm> {
        let (a, b) = (ins[0], ins[1]);
        if !out.dtype.is_float() || a.dtype != out.dtype || b.dtype != out.dtype {
            return None;
        }
        let a2 = if a.shape.len() == 1 { vec![1, a.shape[0]] } else { a.shape.clone() };
        let b2 = if b.shape.len() == 1 { vec![b.shape[0], 1] } else { b.shape.clone() };
        let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
        let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
        let batch = smelt_ir::broadcast(ab, bb)?;
        if batch.iter().product::<usize>() > MAX_BATCH {
            return None;
        }
        let scaled = |s: Vec<usize>, size: usize| s.into_iter().map(|x| x * size).collect::<Vec<_>>();
        let batch_strides =
            (scaled(smelt_ir::broadcast_strides(ab, &batch), m * k), scaled(smelt_ir::broadcast_strides(bb, &batch), k * n));
        let suffix = if out.dtype == DType::F32 { String::new() } else { format!("_{}", out.dtype) };
        let dims = |s: &[usize]| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let name = format!("matmul_{}_{}{suffix}", dims(&a.shape), dims(&b.shape));
        Some(Gemm {
            name,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            act: Act::None,
            dtype: out.dtype,
            a_dtype: a.dtype,
            batch,
            batch_strides,
            output: out.shape.clone(),
            epilogue: None,
            tensor_cores: crate::tile::tensor_core_type(out.dtype),
            tf32: false,
            tile: Tile::SQUARE,
        })
    }

    /// Matrices computed (the grid's z extent).
    pub fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// Launch geometry: (grid x, grid y) of output tiles.
    pub fn grid(&self) -> (usize, usize) {
        if self.tensor_cores {
            (self.n.div_ceil(self.tile.n), self.m.div_ceil(self.tile.m))
        } else {
            (self.n.div_ceil(TILE), self.m.div_ceil(TILE))
        }
    }

    /// Whether the tensor-core tiles load A and B 16 bytes at a time: A
    /// where it is not transposed and its rows (and batch strides) are
    /// whole vectors; B where its contiguous dim (n, or k when transposed)
    /// and batch strides are. Where both do, the tiles are double-buffered
    /// and filled by `cp.async`.
    pub fn vector_loads(&self) -> (bool, bool) {
        let v = 16 / self.dtype.size();
        let whole = |strides: &[usize]| strides.iter().all(|s| s.is_multiple_of(v));
        let tc = self.tensor_cores && self.a_dtype == self.dtype;
        let a = tc && !self.trans_a && self.k.is_multiple_of(v) && whole(&self.batch_strides.0);
        let b = tc && (if self.trans_b { self.k } else { self.n }).is_multiple_of(v) && whole(&self.batch_strides.1);
        (a, b)
    }

    /// Threads per block (x, y).
    pub fn block(&self) -> [usize; 2] {
        if self.tensor_cores {
            [self.tile.threads(), 1]
        } else {
            [TILE, TILE]
        }
    }

    /// The CUDA C source: `extern "C" __global__ void NAME(a, b, [c,] out)`.
    pub fn cuda(&self) -> String {
        let (ty, load, store) = crate::c_type(self.dtype);
        let (aty, aload, _) = crate::c_type(self.a_dtype);
        let (m, n, k) = (self.m, self.n, self.k);
        // Batch offsets, for a batched product only (a Gemm's text stays as it was).
        let batched = !self.batch.is_empty();
        let (ao, bo, oo) = if batched { ("ao + ", "bo + ", "oo + ") } else { ("", "", "") };
        let a_at = |r: &str, c: &str| {
            if self.trans_a {
                format!("a[{ao}(unsigned long long)({c}) * {m} + ({r})]")
            } else {
                format!("a[{ao}(unsigned long long)({r}) * {k} + ({c})]")
            }
        };
        let b_at = |r: &str, c: &str| {
            if self.trans_b {
                format!("b[{bo}(unsigned long long)({c}) * {k} + ({r})]")
            } else {
                format!("b[{bo}(unsigned long long)({r}) * {n} + ({c})]")
            }
        };
        let (avec, bvec) = self.vector_loads();
        let pipelined = avec && bvec;
        let mut s = String::from("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
        if self.tensor_cores {
            s += "#include <mma.h>\n";
            if pipelined {
                s += "#include <cuda_pipeline.h>\n";
            }
            s += "using namespace nvcuda;\n";
        }
        s += "\n";
        s += &format!(
            "// {}: act={} (alpha {:?} * op(A)[{m}x{k}] @ op(B)[{k}x{n}] + beta {:?} * C), {}\n",
            self.name,
            self.act,
            self.alpha,
            self.beta,
            if pipelined {
                format!("{}x{} tiles on tensor cores, double-buffered by cp.async", self.tile.m, self.tile.n)
            } else if self.tensor_cores {
                format!("{}x{} tiles on tensor cores", self.tile.m, self.tile.n)
            } else {
                format!("{TILE}x{TILE} tiles")
            }
        );
        let mut bias = if self.bias.is_some() { format!("const {ty}* __restrict__ c, ") } else { String::new() };
        let mut out_ty = ty;
        if let Some(e) = &self.epilogue {
            // The epilogue, evaluated at one flat index of the output.
            let params: Vec<String> = e
                .inputs
                .iter()
                .enumerate()
                .skip(1)
                .map(|(i, (d, _))| format!("const {}* __restrict__ in{i}", crate::c_type(*d).0))
                .collect();
            bias += &params.iter().map(|p| format!("{p}, ")).collect::<String>();
            let params: String = params.iter().map(|p| format!(", {p}")).collect();
            s += &format!("__device__ __forceinline__ float epilogue_{}(float p{params}, unsigned long long f) {{\n", self.name);
            s += &crate::elementwise::expr_c_at(&e.expr, &e.shape, &e.inputs, "f", Some(0));
            s += "}\n\n";
            out_ty = crate::c_type(e.out).0;
        }
        s += &format!(
            "extern \"C\" __global__ void {}(const {}* __restrict__ a, const {}* __restrict__ b, {bias}{out_ty}* __restrict__ out) {{\n",
            self.name,
            if avec { "uint4" } else { aty },
            if bvec { "uint4" } else { ty },
        );
        // The result at (row, col) from its accumulator `acc`: alpha, bias,
        // activation, the epilogue, the store.
        let finish = |ind: &str, acc: &str, exit: &str| {
            let mut e = format!("{ind}if (row >= {m} || col >= {n}) {exit};\n{ind}float v = {} * {acc};\n", crate::c_f32(self.alpha));
            if let Some(st) = &self.bias {
                e += &format!(
                    "{ind}v += {} * {load}(c[(unsigned long long)row * {} + (unsigned long long)col * {}]);\n",
                    crate::c_f32(self.beta),
                    st[0],
                    st[1]
                );
            }
            e += &format!("{ind}v = {};\n", act_c(self.act, "v"));
            match &self.epilogue {
                Some(ep) => {
                    let args: String = (1..ep.inputs.len()).map(|i| format!(", in{i}")).collect();
                    e += &format!("{ind}unsigned long long f = {oo}(unsigned long long)row * {n} + col;\n");
                    e += &format!("{ind}out[f] = {};\n", crate::store_c(ep.out, &format!("epilogue_{}(v{args}, f)", self.name)));
                }
                None => e += &format!("{ind}out[{oo}(unsigned long long)row * {n} + col] = {store}(v);\n"),
            }
            e
        };
        // This block's matrix: each operand's offset from its batch strides.
        let mut offsets = String::new();
        if batched {
            offsets += &format!("    unsigned long long z = blockIdx.z, ao = 0, bo = 0, oo = z * {}ull;\n", m * n);
        }
        for d in (0..self.batch.len()).rev() {
            let (sa, sb) = (self.batch_strides.0[d], self.batch_strides.1[d]);
            offsets += &format!("    ao += (z % {0}ull) * {sa}ull; bo += (z % {0}ull) * {sb}ull; z /= {0}ull;\n", self.batch[d]);
        }
        if self.tensor_cores {
            let (tl, tk) = (self.tile, crate::tile::DEPTH);
            let (tm, tn) = (tl.m, tl.n);
            let v = 16 / self.dtype.size();
            // A transposed B read 16 bytes at a time is kept k-major.
            let st = crate::tile::Staging { b_kmajor: bvec && self.trans_b, c_colmajor: false, pipelined };
            let (lda, ldb, _) = tl.lds(st);
            let [fm, fn_] = tl.frags();
            let (f, threads) = (Fragments::of(self.dtype), tl.threads());
            s += &format!(
                "    // {tm}x{tn} tiles, {} warps, each {fm}x{fn_} wmma {} products of {ty} (f32 accumulators) per {tk}-deep step.\n",
                threads / 32,
                f.what()
            );
            s += &tl.declare(ty, self.dtype.size(), st);
            s += &format!("    const int m0 = blockIdx.y * {tm}, n0 = blockIdx.x * {tn};\n");
            s += &offsets;
            if !pipelined {
                s += &format!("    const {ty} zero = {store}(0.0f);\n");
            }
            if avec || bvec {
                s += "    const uint4 zero4 = {0u, 0u, 0u, 0u};\n";
            }
            s += &format!("    {} acc[{fm}][{fn_}];\n", f.accumulator());
            s += &format!("    #pragma unroll\n    for (int i = 0; i < {fm}; ++i)\n        #pragma unroll\n        for (int j = 0; j < {fn_}; ++j) wmma::fill_fragment(acc[i][j], 0.0f);\n");
            // One step's tiles of A into `da` and B into `db` from k offset
            // `t`: 16-byte chunks (copied asynchronously when pipelined), or
            // elements with consecutive threads on consecutive elements.
            let loads = |da: &str, db: &str, t: &str| {
                let chunk = |dst: &str, ok: &str, src: String| {
                    if pipelined {
                        format!("    if ({ok}) __pipeline_memcpy_async(&{dst}, &{src}, 16);\n    else *reinterpret_cast<uint4*>(&{dst}) = zero4;\n")
                    } else {
                        format!("    *reinterpret_cast<uint4*>(&{dst}) = ({ok}) ? {src} : zero4;\n")
                    }
                };
                // `chunks` chunks, chunk i at `pos` (which defines r and q).
                let vector = |chunks: usize, pos: String, dst: &str, ok: String, src: String| {
                    format!("#pragma unroll\nfor (int i = tid; i < {chunks}; i += {threads}) {{\n    {pos}\n")
                        + &chunk(&format!("{dst}[r][q]"), &ok, src)
                        + "}\n"
                };
                let mut l = String::new();
                if avec {
                    let pos = format!("int r = i / {0}, q = i % {0} * {v}, row = m0 + r, kk = {t} + q;", tk / v);
                    l += &vector(
                        tm * tk / v,
                        pos,
                        da,
                        format!("row < {m} && kk < {k}"),
                        format!("a[({ao}(unsigned long long)row * {k} + kk) / {v}]"),
                    );
                } else {
                    let (ar, ac) =
                        if self.trans_a { (format!("i % {tm}"), format!("i / {tm}")) } else { (format!("i / {tk}"), format!("i % {tk}")) };
                    l += &format!("#pragma unroll\nfor (int i = tid; i < {}; i += {threads}) {{\n", tm * tk);
                    l += &format!("    int r = {ar}, q = {ac}, row = m0 + r, kk = {t} + q;\n");
                    l += &format!("    {da}[r][q] = (row < {m} && kk < {k}) ? {} : zero;\n}}\n", a_at("row", "kk"));
                }
                let b_ok = format!("kk < {k} && col < {n}");
                if bvec && self.trans_b {
                    let pos = format!("int r = i / {0}, q = i % {0} * {v}, col = n0 + r, kk = {t} + q;", tk / v);
                    l += &vector(tn * tk / v, pos, db, b_ok, format!("b[({bo}(unsigned long long)col * {k} + kk) / {v}]"));
                } else if bvec {
                    let pos = format!("int r = i / {0}, q = i % {0} * {v}, kk = {t} + r, col = n0 + q;", tn / v);
                    l += &vector(tn * tk / v, pos, db, b_ok, format!("b[({bo}(unsigned long long)kk * {n} + col) / {v}]"));
                } else {
                    let (br, bc) =
                        if self.trans_b { (format!("i % {tk}"), format!("i / {tk}")) } else { (format!("i / {tn}"), format!("i % {tn}")) };
                    l += &format!("#pragma unroll\nfor (int i = tid; i < {}; i += {threads}) {{\n", tn * tk);
                    l += &format!("    int r = {br}, q = {bc}, kk = {t} + r, col = n0 + q;\n");
                    l += &format!("    {db}[r][q] = (kk < {k} && col < {n}) ? {} : zero;\n}}\n", b_at("kk", "col"));
                }
                l
            };
            let ind = crate::tile::indent;
            if pipelined {
                // Stage `kt % 2` holds step kt's tiles; step kt + 1's are
                // copied into the other while kt's products run.
                let stage = |at: &str, names| tl.stage(ty, self.dtype.size(), st, at, names);
                let steps = k.div_ceil(tk);
                s += &format!(
                    "    {{\n{}    }}\n    __pipeline_commit();\n",
                    ind(&(stage("0", ("an", "bn")) + &loads("an", "bn", "0")), "        ")
                );
                s += &format!("    for (int kt = 0; kt < {steps}; ++kt) {{\n");
                let next = stage("(kt + 1) % 2", ("an", "bn")) + &loads("an", "bn", &format!("(kt + 1) * {tk}"));
                s += &format!("        if (kt + 1 < {steps}) {{\n{}        }}\n", ind(&next, "            "));
                s += "        __pipeline_commit();\n        __pipeline_wait_prior(1);\n        __syncthreads();\n";
                s += &ind(&stage("kt % 2", ("as", "bs")), "        ");
            } else {
                s += &format!("    for (int t = 0; t < {k}; t += {tk}) {{\n");
                s += &ind(&loads("as", "bs", "t"), "        ");
                s += "        __syncthreads();\n";
            }
            s += &f.products(tk, tl.frags(), (lda, ldb), st.b_kmajor, "        ");
            // Before the next step's loads overwrite the tiles.
            s += "        __syncthreads();\n    }\n";
            s += &tl.epilogue(&("int row = m0 + mm, col = n0 + pp;\n".to_string() + &finish("", "cv", "continue")), st);
            s += "}\n";
            return s;
        }
        s += &format!("    __shared__ float as[{TILE}][{TILE}];\n    __shared__ float bs[{TILE}][{TILE}];\n");
        s += &format!("    int tx = threadIdx.x, ty = threadIdx.y;\n    int row = blockIdx.y * {TILE} + ty, col = blockIdx.x * {TILE} + tx;\n    float acc = 0.0f;\n");
        s += &offsets;
        s += &format!("    for (int t = 0; t < {k}; t += {TILE}) {{\n");
        s += &format!("        as[ty][tx] = (row < {m} && t + tx < {k}) ? {aload}({}) : 0.0f;\n", a_at("row", "t + tx"));
        s += &format!("        bs[ty][tx] = (t + ty < {k} && col < {n}) ? {load}({}) : 0.0f;\n", b_at("t + ty", "col"));
        s += &format!("        __syncthreads();\n        #pragma unroll\n        for (int j = 0; j < {TILE}; ++j) acc += as[ty][j] * bs[j][tx];\n        __syncthreads();\n    }}\n");
        s += &finish("    ", "acc", "return");
        s += "}\n";
        s
    }

    /// Runs the description on the CPU as the kernel does (f32 accumulation
    /// in ascending k, then alpha, bias, activation). The tensor-core
    /// kernel's products of halves are exact in f32 and its fragments
    /// accumulate in ascending k too, so one description serves both.
    pub fn run_cpu(&self, inputs: &[&Tensor]) -> Tensor {
        let tf32 = |v: Vec<f32>| if self.tf32 { v.into_iter().map(smelt_ir::round_tf32).collect() } else { v };
        let (av, bv) = (tf32(inputs[0].to_f32_vec()), tf32(inputs[1].to_f32_vec()));
        let cv = self.bias.as_ref().map(|_| inputs[2].to_f32_vec());
        let (m, n, k) = (self.m, self.n, self.k);
        let mut out = vec![0f32; self.batches() * m * n];
        // A's rows and blocks of B's columns copied contiguous (B in blocks
        // of 16 columns: each cache line of B is read once); each output
        // still sums its k products in order.
        const COLS: usize = 16;
        let mut a_rows = vec![0f32; m * k];
        let mut b_cols = vec![0f32; COLS * k];
        for z in 0..self.batches() {
            let (mut rem, mut ao, mut bo) = (z, 0, 0);
            for d in (0..self.batch.len()).rev() {
                ao += (rem % self.batch[d]) * self.batch_strides.0[d];
                bo += (rem % self.batch[d]) * self.batch_strides.1[d];
                rem /= self.batch[d];
            }
            for row in 0..m {
                for j in 0..k {
                    a_rows[row * k + j] = if self.trans_a { av[ao + j * m + row] } else { av[ao + row * k + j] };
                }
            }
            for c0 in (0..n).step_by(COLS) {
                let cb = COLS.min(n - c0);
                for j in 0..k {
                    for c in 0..cb {
                        let col = c0 + c;
                        b_cols[c * k + j] = if self.trans_b { bv[bo + col * k + j] } else { bv[bo + j * n + col] };
                    }
                }
                for row in 0..m {
                    let a = &a_rows[row * k..][..k];
                    for c in 0..cb {
                        let col = c0 + c;
                        let mut acc = 0.0f32;
                        for (x, y) in a.iter().zip(&b_cols[c * k..][..k]) {
                            acc += x * y;
                        }
                        let mut v = self.alpha * acc;
                        if let (Some(cv), Some(st)) = (&cv, &self.bias) {
                            v += self.beta * cv[row * st[0] + col * st[1]];
                        }
                        out[(z * m + row) * n + col] = self.act.apply(v);
                    }
                }
            }
        }
        match &self.epilogue {
            None => Tensor::from_f32(self.output.clone(), out).cast(self.dtype),
            Some(e) => {
                let p = Tensor::from_f32(e.shape.clone(), out);
                let ins: Vec<&Tensor> = std::iter::once(&p).chain(inputs[2..].iter().copied()).collect();
                crate::elementwise::eval_cpu(&e.expr, &e.shape, &e.inputs, &ins).cast(e.out)
            }
        }
    }
}

/// The `wmma` fragments of a tensor-core tile whose operands are of one
/// type: 16x16x16 for f16 and bf16, 16x16x8 in TF32 for f32 (each operand
/// rounded with `__float_to_tf32` once loaded, as the description rounds
/// it).
pub(crate) struct Fragments {
    ty: &'static str,
    k: usize,
    tf32: bool,
}

impl Fragments {
    pub(crate) fn of(d: DType) -> Fragments {
        match d {
            DType::F32 => Fragments { ty: "wmma::precision::tf32", k: 8, tf32: true },
            d => Fragments { ty: crate::c_type(d).0, k: 16, tf32: false },
        }
    }

    /// What they multiply, for comments.
    pub(crate) fn what(&self) -> String {
        format!("16x16x{}{}", self.k, if self.tf32 { " TF32" } else { "" })
    }

    /// The accumulator fragment's type.
    pub(crate) fn accumulator(&self) -> String {
        format!("wmma::fragment<wmma::accumulator, 16, 16, {}, float>", self.k)
    }

    /// A warp's `fm x fn` products over one `depth`-deep step: `a[i]` from
    /// `as[wm + 16 * i][..]`, `b[j]` from `bs[..][wn + 16 * j]`, or from
    /// `bs[wn + 16 * j][..]` with `b_kmajor` (leading dims `lda`, `ldb`),
    /// accumulated into `acc[i][j]` in ascending k.
    pub(crate) fn products(&self, depth: usize, [fm, fn_]: [usize; 2], (lda, ldb): (usize, usize), b_kmajor: bool, indent: &str) -> String {
        let (ty, fk) = (self.ty, self.k);
        let mut s = String::new();
        for k0 in (0..depth).step_by(fk) {
            s += &format!("wmma::fragment<wmma::matrix_a, 16, 16, {fk}, {ty}, wmma::row_major> a{k0}[{fm}];\n");
            let (b_layout, b_at) =
                if b_kmajor { ("col_major", format!("bs[wn + 16 * j][{k0}]")) } else { ("row_major", format!("bs[{k0}][wn + 16 * j]")) };
            s += &format!("wmma::fragment<wmma::matrix_b, 16, 16, {fk}, {ty}, wmma::{b_layout}> b{k0}[{fn_}];\n");
            s += &format!(
                "#pragma unroll\nfor (int i = 0; i < {fm}; ++i) wmma::load_matrix_sync(a{k0}[i], &as[wm + 16 * i][{k0}], {lda});\n"
            );
            s += &format!("#pragma unroll\nfor (int j = 0; j < {fn_}; ++j) wmma::load_matrix_sync(b{k0}[j], &{b_at}, {ldb});\n");
            if self.tf32 {
                s += &format!("for (int i = 0; i < {fm}; ++i)\n    for (int t = 0; t < a{k0}[i].num_elements; ++t) a{k0}[i].x[t] = wmma::__float_to_tf32(a{k0}[i].x[t]);\n");
                s += &format!("for (int j = 0; j < {fn_}; ++j)\n    for (int t = 0; t < b{k0}[j].num_elements; ++t) b{k0}[j].x[t] = wmma::__float_to_tf32(b{k0}[j].x[t]);\n");
            }
            s += &format!("#pragma unroll\nfor (int i = 0; i < {fm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {fn_}; ++j) wmma::mma_sync(acc[i][j], a{k0}[i], b{k0}[j], acc[i][j]);\n");
        }
        s.lines().map(|l| format!("{indent}{l}\n")).collect()
    }
}

/// The activation `act` applied to the C expression `x`.
pub fn act_c(act: Act, x: &str) -> String {
    match act {
        Act::None => x.to_string(),
        Act::Relu => crate::c_max(x, "0.0f"),
        Act::Clip(lo, hi) => crate::c_clip(x, lo, hi),
        Act::Sigmoid => format!("1.0f / (1.0f + expf(-{x}))"),
        Act::Silu => format!("{x} / (1.0f + expf(-{x}))"),
        Act::Gelu => crate::elementwise::unary_c(smelt_ir::UnaryOp::Gelu, x),
        Act::GeluTanh => crate::elementwise::unary_c(smelt_ir::UnaryOp::GeluTanh, x),
    }
}
