//! Block tiles of the tensor-core convolution and GEMM, chosen per kernel
//! by the roofline model ([`crate::cost`]).
//!
//! A tile is `m x n` outputs for a block of warps in a grid, each warp's
//! part held as 16x16 `wmma` accumulators, fed from [`DEPTH`]-deep
//! shared-memory tiles of the operands; the accumulators go back through
//! shared memory (in the operands' bytes, a row of warps at a time where
//! the whole tile would not fit) to the epilogue, so its loads and stores
//! are coalesced. A larger tile loads fewer fragments per product (with f16
//! operands, a 64x64 tile of 32x32 warp tiles reads a shared byte per 10.7
//! FLOPs, a 128x128 one of 64x32 warp tiles one per 16), but gives fewer
//! blocks: which wins depends on the problem's shape and the GPU, so each
//! kernel takes the candidate the model estimates fastest on the target GPU
//! (`--device`, the H100 by default), the square 64x64 tile on a tie: a
//! choice made after lowering, by [`crate::tiling`]. This module is the
//! tiles' geometry only, below every describer.

use smelt_ir::DType;

/// Depth of a shared-memory tile of the operands.
pub const DEPTH: usize = 16;
/// Static shared memory a block may declare, bytes.
const STATIC_SHARED: usize = 48 * 1024;

/// How a kernel's operand and result tiles sit in shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Staging {
    /// `bs` is `[n][DEPTH + 8]`, k fastest (a channels-last input: each
    /// column of im2col(x) is contiguous channels), read as `col_major`
    /// fragments; else `[DEPTH][n + 8]`.
    pub b_kmajor: bool,
    /// The results are staged column-major, `cs[n][rows + 4]`, and read
    /// back rows fastest (a channels-last output: consecutive threads store
    /// consecutive channels); else `cs[rows][n + 4]`, columns fastest.
    pub c_colmajor: bool,
    /// Two stages of operand tiles, filled by `cp.async`
    /// (`__pipeline_memcpy_async`) one step ahead of the products.
    pub pipelined: bool,
}

/// A tensor-core block tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    /// Rows (output channels, GEMM rows).
    pub m: usize,
    /// Columns (output positions, GEMM columns).
    pub n: usize,
    /// Warps along the rows.
    pub warps_m: usize,
    /// Warps along the columns.
    pub warps_n: usize,
}

impl Tile {
    /// 64x64: 4 warps of 32x32.
    pub const SQUARE: Tile = Tile { m: 64, n: 64, warps_m: 2, warps_n: 2 };
    /// The candidates, the square first (it wins ties): 64x64, 128x64 and
    /// 64x128 on 4 warps, 128x128 on 8.
    pub const CANDIDATES: [Tile; 4] = [
        Tile::SQUARE,
        Tile { m: 128, n: 64, warps_m: 2, warps_n: 2 },
        Tile { m: 64, n: 128, warps_m: 2, warps_n: 2 },
        Tile { m: 128, n: 128, warps_m: 2, warps_n: 4 },
    ];

    /// The candidate of `m x n` outputs.
    pub fn candidate([m, n]: [usize; 2]) -> Option<Tile> {
        Tile::CANDIDATES.into_iter().find(|t| t.m == m && t.n == n)
    }

    /// Threads per block.
    pub fn threads(self) -> usize {
        32 * self.warps_m * self.warps_n
    }

    /// A warp's accumulators: rows and columns of 16x16 fragments.
    pub fn frags(self) -> [usize; 2] {
        [self.m / self.warps_m / 16, self.n / self.warps_n / 16]
    }

    /// What a kernel's name says of it: nothing for the square tile.
    pub fn suffix(self) -> String {
        if self == Tile::SQUARE {
            String::new()
        } else {
            format!("_t{}x{}", self.m, self.n)
        }
    }

    /// Leading dimensions of `as[m][lda]`, `bs` (operands) and `cs` (f32
    /// results) as `st` lays them out, padded against bank conflicts and
    /// kept multiples of 8 elements, as `wmma` loads need.
    pub fn lds(self, st: Staging) -> (usize, usize, usize) {
        let ldb = if st.b_kmajor { DEPTH + 8 } else { self.n + 8 };
        let ldc = if st.c_colmajor { self.stage_rows(st) + 4 } else { self.n + 4 };
        (DEPTH + 8, ldb, ldc)
    }

    /// Rows of results staged at a time: the whole tile, or a row of warps
    /// where the whole would not fit in static shared memory.
    fn stage_rows(self, st: Staging) -> usize {
        let bytes = |rows: usize| if st.c_colmajor { self.n * (rows + 4) * 4 } else { rows * (self.n + 4) * 4 };
        if bytes(self.m) <= STATIC_SHARED - 8 * 1024 {
            self.m
        } else {
            self.m / self.warps_m
        }
    }

    /// Static shared memory per block for operands of `elt` bytes: the
    /// operand tiles, and the f32 results staged in the same bytes once the
    /// products are done.
    pub fn shared_bytes(self, elt: usize, st: Staging) -> usize {
        let (_, _, ldc) = self.lds(st);
        let c_rows = if st.c_colmajor { self.n } else { self.stage_rows(st) };
        let stages = if st.pipelined { 2 } else { 1 };
        (stages * self.stage_bytes(elt, st)).max(c_rows * ldc * 4)
    }

    /// Bytes of one stage of operand tiles, `as` then `bs`.
    fn stage_bytes(self, elt: usize, st: Staging) -> usize {
        let (lda, ldb, _) = self.lds(st);
        let b_rows = if st.b_kmajor { self.n } else { DEPTH };
        self.m * lda * elt + b_rows * ldb * elt
    }

    /// The declarations of `a` and `b`, the operand tiles of stage `stage`
    /// (a C expression) of a pipelined kernel.
    pub fn stage(self, ty: &str, elt: usize, st: Staging, stage: &str, (a, b): (&str, &str)) -> String {
        let (lda, ldb, _) = self.lds(st);
        let (bytes, a_bytes) = (self.stage_bytes(elt, st), self.m * lda * elt);
        format!(
            "{ty} (*{a})[{lda}] = reinterpret_cast<{ty} (*)[{lda}]>(smem + ({stage}) * {bytes});\n{ty} (*{b})[{ldb}] = reinterpret_cast<{ty} (*)[{ldb}]>(smem + ({stage}) * {bytes} + {a_bytes});\n"
        )
    }

    /// The C declarations of `as`, `bs` (unless pipelined: see
    /// [`Tile::stage`]) and `cs` over one shared buffer `smem` (operands of
    /// C type `ty` and `elt` bytes, laid out as `st` says),
    /// and of the thread's warp origin `wm`, `wn`.
    pub fn declare(self, ty: &str, elt: usize, st: Staging) -> String {
        let (lda, ldb, ldc) = self.lds(st);
        let a_bytes = self.m * lda * elt;
        // Two TF32 stages of 128x128 fill static shared memory exactly.
        debug_assert!(self.shared_bytes(elt, st) <= STATIC_SHARED, "{self:?} {st:?}: more static shared memory than a block may declare");
        let mut s = format!("    __shared__ __align__(32) unsigned char smem[{}];\n", self.shared_bytes(elt, st));
        if !st.pipelined {
            s += &format!("    {ty} (*as)[{lda}] = reinterpret_cast<{ty} (*)[{lda}]>(smem);\n");
            s += &format!("    {ty} (*bs)[{ldb}] = reinterpret_cast<{ty} (*)[{ldb}]>(smem + {a_bytes});\n");
        }
        s += &format!("    float (*cs)[{ldc}] = reinterpret_cast<float (*)[{ldc}]>(smem); // after the products\n");
        let (wm, wn) = (self.m / self.warps_m, self.n / self.warps_n);
        s + &format!("    const int tid = threadIdx.x, wm = tid / {} * {wm}, wn = tid / 32 % {} * {wn};\n", 32 * self.warps_n, self.warps_n)
    }

    /// After the products' last barrier: the accumulators `acc` staged in
    /// `cs` as `st` says, then `body` run for each result of the tile by the
    /// block's threads, with `mm`, `pp` its row and column in the tile and
    /// `cv` its value (`continue` skips one); consecutive threads take
    /// consecutive columns, or consecutive rows with `st.c_colmajor`.
    pub fn epilogue(self, body: &str, st: Staging) -> String {
        let [fm, fn_] = self.frags();
        let (ldc, rows, n, threads) = (self.lds(st).2, self.stage_rows(st), self.n, self.threads());
        let passes = self.m / rows;
        let (at, layout, mm, pp, cv) = if st.c_colmajor {
            (
                format!("cs[wn + 16 * j][wm - h * {rows} + 16 * i]"),
                "wmma::mem_col_major",
                format!("h * {rows} + i % {rows}"),
                format!("i / {rows}"),
                format!("cs[i / {rows}][i % {rows}]"),
            )
        } else {
            (
                format!("cs[wm - h * {rows} + 16 * i][wn + 16 * j]"),
                "wmma::mem_row_major",
                format!("h * {rows} + i / {n}"),
                format!("i % {n}"),
                format!("cs[i / {n}][pp]"),
            )
        };
        let store = format!("for (int i = 0; i < {fm}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {fn_}; ++j) wmma::store_matrix_sync(&{at}, acc[i][j], {ldc}, {layout});\n");
        let mut s = format!("for (int h = 0; h < {passes}; ++h) {{\n");
        if passes > 1 {
            s += &format!("    if (wm / {rows} == h) {{\n        #pragma unroll\n{}    }}\n", indent(&store, "        "));
        } else {
            s += &format!("    #pragma unroll\n{}", indent(&store, "    "));
        }
        s += "    __syncthreads();\n";
        s += &format!("    for (int i = tid; i < {}; i += {threads}) {{\n", rows * n);
        s += &format!("        int mm = {mm}, pp = {pp};\n        float cv = {cv};\n");
        s += &indent(body, "        ");
        s += "    }\n";
        if passes > 1 {
            s += "    __syncthreads();\n";
        }
        s += "}\n";
        indent(&s, "    ")
    }

    /// Registers per thread as ptxas allocates them for sm_80 and sm_90,
    /// roughly: 8 per accumulator fragment, 8 per operand fragment (TF32's
    /// two 8-deep halves held at once), and about 32 for addresses and the
    /// tile loads (measured with `--ptxas-stats`: 88 for a 64x64 f16 tile,
    /// 127 for 128x64; 96 and 150-166 in TF32).
    pub fn registers(self, elt: usize) -> usize {
        let [fm, fn_] = self.frags();
        32 + 8 * fm * fn_ + 8 * (fm + fn_) + if elt == 4 { 16 } else { 0 }
    }

    /// Bytes a block moves through shared memory over `steps` steps with
    /// operands of `elt` bytes: each warp's fragments loaded, the operand
    /// tiles stored, and the results staged and read back.
    pub fn shared_traffic(self, steps: usize, elt: usize) -> usize {
        let [fm, fn_] = self.frags();
        let per_step = self.warps_m * self.warps_n * (fm + fn_) * 16 * DEPTH * elt + (self.m + self.n) * DEPTH * elt;
        steps * per_step + 2 * self.m * self.n * 4
    }
}

/// Each line of `s` indented by `ind`.
pub(crate) fn indent(s: &str, ind: &str) -> String {
    s.lines().map(|l| if l.is_empty() { "\n".to_string() } else { format!("{ind}{l}\n") }).collect()
}

/// Whether tensor cores multiply operands of type `d` (f16 and bf16, with
/// f32 accumulation).
pub fn tensor_core_type(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}
