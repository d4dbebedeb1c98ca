//! The generated CUDA C itself, run on the CPU by the emulator backend: the
//! same program a GPU runs (launch order and sizes, parameters packed as for
//! cudarc, pointers as offsets into one arena and one weights blob), each
//! kernel compiled by the host C++ compiler against smelt's CUDA header.
//!
//! Every kernel is checked against its description's CPU run on the operands
//! the emulator gave it (so errors do not compound), and whole programs
//! against external oracles: onnxruntime's logits for the light models'
//! random-weight variants, the CPU reference executor for the
//! torchvision-style zoo models and random graphs.

mod common;

use smelt_codegen::tiling::kernel_of;
use smelt_ir::builder::Builder;
use smelt_ir::{Graph, KernelGraph, Op, Tensor, ValueId};
use smelt_runtime::emu::Schedule;
use smelt_runtime::exec::KernelCheck;
use std::collections::BTreeSet;

/// Tolerance of a kernel against its description, relative to the range of
/// its output (plus one unit in the last place of a half output). The
/// emulator compiles with no contraction, as the descriptions compute, so
/// most kernels agree bit for bit.
const KERNEL_RTOL: f64 = 1e-5;

/// What a run on the emulator gave.
struct Emulated {
    graph: KernelGraph,
    outputs: Vec<Tensor>,
    checks: Vec<KernelCheck>,
}

/// `plain` through the driver (fusion unless `no_fuse`, the precision
/// `policy`), planned, lowered and run on the emulator with every kernel
/// checked.
/// `f32` is exact f32 (`--tf32 off`), `tf32` f32 with the default
/// `--tf32 conv`.
fn emulate(plain: &Graph, no_fuse: bool, policy: &str, inputs: &[Tensor]) -> Emulated {
    emulate_in(plain, options(no_fuse, policy), inputs, &[Schedule::Lockstep])
}

/// As [`emulate`], run once in every [`Schedule`]: each run's kernels
/// checked, and each run's outputs bit for bit the first's (else threads of
/// a block race).
fn emulate_in_every_order(plain: &Graph, policy: &str, inputs: &[Tensor]) -> Emulated {
    emulate_in(plain, options(false, policy), inputs, &Schedule::ALL)
}

/// The driver's options for [`emulate`].
fn options(no_fuse: bool, policy: &str) -> smelt::Options {
    let tf32 = if policy == "tf32" { smelt_ir::Tf32::Conv } else { smelt_ir::Tf32::Off };
    let policy = if policy == "tf32" { "f32" } else { policy };
    smelt::Options {
        no_fuse,
        precision: smelt_passes::precision::Options { policy: policy.parse().unwrap(), keep_f32: vec![], tf32 },
        ..Default::default()
    }
}

/// `plain` compiled with the driver's options and run on the emulator once
/// per schedule (see [`emulate_in_every_order`]).
fn emulate_in(plain: &Graph, opts: smelt::Options, inputs: &[Tensor], schedules: &[Schedule]) -> Emulated {
    let (program, compiled) = program(plain, opts);
    let blob = program.weights_blob(&compiled.graph).unwrap();
    let mut exec = smelt_runtime::emu::executor(program, &blob, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    exec.check_against_reference(compiled.graph.clone()).unwrap();
    let mut first: Option<(Vec<Tensor>, Vec<KernelCheck>)> = None;
    for &schedule in schedules {
        exec.device_mut().set_schedule(schedule);
        let (outputs, mut checks) = exec.run_checked(inputs, KERNEL_RTOL).unwrap_or_else(|e| panic!("{schedule:?}: {e}"));
        match &mut first {
            None => first = Some((outputs, checks)),
            Some((want, all)) => {
                for (i, (a, b)) in want.iter().zip(&outputs).enumerate() {
                    let same = a.data().to_le_bytes() == b.data().to_le_bytes();
                    assert!(same, "output {i} in the schedule {schedule:?} differs from {:?}'s: threads of a block race", schedules[0]);
                }
                all.append(&mut checks);
            }
        }
    }
    let (outputs, checks) = first.expect("at least one schedule");
    Emulated { graph: compiled.graph, outputs, checks }
}

/// `plain` compiled with the driver's options, planned and lowered.
fn program(plain: &Graph, opts: smelt::Options) -> (smelt_codegen::Program, smelt::Compiled) {
    let mut s = common::session(plain, opts);
    let compiled = s.compile().unwrap_or_else(|e| panic!("{e}"));
    let planned = s.plan(&compiled).unwrap_or_else(|e| panic!("{e}"));
    let program = s.program(&compiled, &planned).unwrap_or_else(|e| panic!("{e}"));
    (program, compiled)
}

/// Asserts every kernel agreed with its description.
fn assert_kernels_agree(what: &str, e: &Emulated) {
    let bad: Vec<String> = e
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!(
                "{} (node {}) against its {:?}: max abs err {:.3e}, {:.3e} of range, {} elements",
                c.kernel, c.node, c.against, c.max_abs, c.of_range, c.mismatches
            )
        })
        .collect();
    assert!(bad.is_empty(), "{what}: kernels disagree with their descriptions or the reference:\n{}", bad.join("\n"));
}

/// Reads a variant's tensor file.
fn tensor(name: &str, file: &str) -> Tensor {
    smelt_ir::onnx::read_tensor_file(&common::variant(name).join(file)).unwrap_or_else(|e| panic!("{name}/{file}: {e}")).1
}

/// A kernel's name without its shapes and tile (`conv3x3_bias_relu_n1c64h55w55_m192_tf32_to_nchw`
/// is `conv3x3_bias_relu_tf32_to_nchw`): which code paths it takes (op,
/// window, stride, groups, epilogue, dtype, layouts, vector loads).
fn variant_of(kernel: &str) -> String {
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let dims = |t: &str| t.split('x').all(digits);
    let shape = |t: &str| {
        let mut rest = t;
        for l in ['n', 'c', 'h', 'w'] {
            let Some(r) = rest.strip_prefix(l) else { return false };
            let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            if end == 0 {
                return false;
            }
            rest = &r[end..];
        }
        rest.is_empty()
    };
    let after = |t: &str, p: char| t.strip_prefix(p).is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    let mut kept = Vec::new();
    for t in kernel.split('_') {
        // GEMMs: `m1n4096k25088`, or the sizes after the transposes (`tbn1000k1024`).
        let t = t
            .find(|c: char| c.is_ascii_digit())
            .filter(|&i| i > 0 && t[i - 1..].starts_with('n') && t.contains('k'))
            .map_or(t, |i| &t[..i - 1]);
        if t.is_empty() || dims(t) || shape(t) || after(t, 'm') || (after(t, 't') && dims(&t[1..])) {
            continue;
        }
        kept.push(t);
    }
    kept.join("_")
}

/// The light models' configurations on the emulator: (name, unfused, policy).
const LIGHT_CONFIGS: [(&str, bool, &str); 5] = [
    ("fused", false, "f32"),
    ("unfused", true, "f32"),
    ("tf32", false, "tf32"),
    ("mixed-f16", false, "mixed-f16"),
    ("mixed-bf16", false, "mixed-bf16"),
];

/// The configurations chosen from together: the three on tensor cores
/// differ only in their operands' type.
fn light_group(config: &str) -> &'static [&'static str] {
    match config {
        "tf32" | "mixed-f16" | "mixed-bf16" => &["tf32", "mixed-f16", "mixed-bf16"],
        "fused" => &["fused"],
        _ => &["unfused"],
    }
}

/// A kernel variant without its operands' type (`conv3x3_bias_relu_f16_to_nchw`
/// is `conv3x3_bias_relu_to_nchw`, as in bf16 and TF32).
fn typeless(variant: &str) -> String {
    let t: Vec<&str> = variant
        .split('_')
        .map(|t| ["bf16", "tf32", "f16"].iter().find_map(|d| t.strip_suffix(d)).unwrap_or(t))
        .filter(|t| !t.is_empty())
        .collect();
    t.join("_")
}

/// Which light models run in `config`: the cheapest (by FLOPs) pairs of a
/// model and a configuration of its group ([`light_group`]) whose programs
/// hold every kernel variant ([`variant_of`], every code path; the tiles
/// are swept in `every_tensor_core_tile_matches_its_description`) that any
/// model has in any configuration of the group, regardless of the operands'
/// type in the tensor-core group (each type's kernels, tile by tile and
/// layout by layout, are checked bit for bit in the tile sweep), each
/// configuration at least once. A model that adds no variant (VGG-19: 60%
/// of the nine's FLOPs) does not run; `SMELT_EMU_ALL_MODELS=1` runs all
/// nine in every configuration. The models' programs in `config`, with
/// the number of variants of the group.
fn light_models_for(config: &str) -> (Vec<(&'static str, Graph, smelt_codegen::Program)>, usize) {
    let group = light_group(config);
    let mut pairs: Vec<(&str, &'static str, Graph, smelt_codegen::Program)> = Vec::new();
    for &c in group {
        let &(_, no_fuse, policy) = LIGHT_CONFIGS.iter().find(|x| x.0 == c).expect("a configuration");
        for &name in &common::LIGHT {
            let plain = common::logits(common::load(common::variant(name).join("model.onnx").to_str().unwrap(), None));
            let (program, _) = program(&plain, options(no_fuse, policy));
            pairs.push((c, name, plain, program));
        }
    }
    let variants: Vec<BTreeSet<String>> =
        pairs.iter().map(|(_, _, _, p)| p.steps.iter().map(|s| typeless(&variant_of(s.kernel.name()))).collect()).collect();
    let flops: Vec<usize> = pairs.iter().map(|(_, _, _, p)| p.steps.iter().map(|s| s.kernel.flops()).sum()).collect();
    let all: BTreeSet<String> = variants.iter().flatten().cloned().collect();
    let mut chosen: Vec<usize> = Vec::new();
    if std::env::var_os("SMELT_EMU_ALL_MODELS").is_some() {
        chosen = (0..pairs.len()).collect();
    } else {
        let mut covered = BTreeSet::new();
        while covered != all || group.iter().any(|c| !chosen.iter().any(|&i| pairs[i].0 == *c)) {
            // A configuration not yet chosen counts as one more variant;
            // the FLOPs a configuration already runs count against it, so
            // that the group's tests take about as long.
            let gain = |i: usize| {
                let fresh = variants[i].difference(&covered).count() + !chosen.iter().any(|&j| pairs[j].0 == pairs[i].0) as usize;
                let load: usize = chosen.iter().filter(|&&j| pairs[j].0 == pairs[i].0).map(|&j| flops[j]).sum();
                fresh as f64 / (flops[i] + load).max(1) as f64
            };
            let best = (0..pairs.len())
                .filter(|i| !chosen.contains(i))
                .max_by(|&a, &b| gain(a).total_cmp(&gain(b)))
                .expect("a pair adds a variant");
            covered.extend(variants[best].iter().cloned());
            chosen.push(best);
        }
    }
    let runs: Vec<String> = chosen.iter().map(|&i| format!("{} {}", pairs[i].1, pairs[i].0)).collect();
    println!("{group:?}: {} kernel variants, covered by {runs:?}", all.len());
    let mut mine: Vec<(usize, (&str, &'static str, Graph, smelt_codegen::Program))> =
        pairs.into_iter().enumerate().filter(|(i, p)| p.0 == config && chosen.contains(i)).collect();
    mine.sort_by_key(|(i, _)| *i);
    (mine.into_iter().map(|(_, (_, name, g, p))| (name, g, p)).collect(), all.len())
}

/// The light models' random-weight variants in `config` of [`LIGHT_CONFIGS`]
/// (those [`light_models_for`] chooses): fused and unfused in f32 against
/// onnxruntime's logits (within 1e-3 relative, plus 1e-4 of the logits'
/// range for the elements near zero); with TF32 convolutions (the default
/// `--tf32 conv`) and under mixed-f16 and mixed-bf16 against the CPU
/// reference executor of the same graph, TF32 operands rounded as the GPU
/// rounds them (1% of the logits' range in TF32 and f16, 3% in bf16) and against onnxruntime (5% of the range in TF32
/// and f16, 20% in bf16, and the same arg-max). The kernel kinds that ran.
fn light_variants_in(config: &str) -> BTreeSet<String> {
    let &(_, no_fuse, policy) = LIGHT_CONFIGS.iter().find(|c| c.0 == config).expect("a configuration");
    let (models, _) = light_models_for(config);
    assert!(!models.is_empty(), "{config}: no model chosen");
    smelt_runtime::emu::precompile(models.iter().map(|m| &m.2)).unwrap_or_else(|e| panic!("{e}"));
    let mut kinds = BTreeSet::new();
    println!("{:<14} {:<10} {:>8} {:>14} {:>12} {:>12}", "model", "config", "kernels", "worst kernel", "vs ort", "vs cpu ref");
    for (name, plain, _) in &models {
        let x = tensor(name, "input_0.pb");
        let want = tensor(name, "logits_0.pb");
        let what = format!("{name} {config}");
        let e = emulate(plain, no_fuse, policy, std::slice::from_ref(&x));
        assert_kernels_agree(&what, &e);
        kinds.extend(
            e.checks
                .iter()
                .map(|c| c.kernel.split('_').next().unwrap_or("").to_string() + if c.kernel.ends_with("_v4") { "_v4" } else { "" }),
        );
        let got = &e.outputs[0];
        let (vs_ort, vs_cpu) = if policy == "f32" {
            let x = common::excess(got, &want, 1e-3, 1e-4);
            assert!(x <= 1.0, "{what}: logits differ from onnxruntime's beyond rtol 1e-3 + 1e-4 of range ({x:.2} times the tolerance)");
            (format!("{x:.3} tol"), String::new())
        } else {
            let reference = smelt_runtime::cpu::run(&e.graph, std::slice::from_ref(&x)).unwrap();
            let r = smelt::precision_error(got, &reference[0]);
            // Half roundings that fall the other way (the reference
            // executor sums convolutions in another order) compound
            // over a deep net.
            // The reference rounds TF32 operands as the GPU does, but a
            // last-bit difference upstream rounds one the other way (2^-11
            // of it), which compounds too (ResNet-50: 6.4e-3 measured).
            let near = if policy == "mixed-bf16" { 3e-2 } else { 1e-2 };
            assert!(
                r.max_abs_over_range <= near,
                "{what}: {:.2e} of range from the CPU reference executor of the same graph",
                r.max_abs_over_range
            );
            let o = smelt::precision_error(got, &want);
            let budget = match policy {
                "tf32" | "mixed-f16" => 5e-2,
                _ => 2e-1,
            };
            assert!(o.max_abs_over_range <= budget, "{what}: {:.2e} of range from onnxruntime's f32 logits", o.max_abs_over_range);
            assert_eq!(o.argmax_agree, o.rows, "{what}: arg-max differs from onnxruntime's");
            (format!("{:.2e} rng", o.max_abs_over_range), format!("{:.2e} rng", r.max_abs_over_range))
        };
        let worst = e.checks.iter().map(|c| c.of_range).fold(0f64, f64::max);
        println!("{name:<14} {config:<10} {:>8} {worst:>14.2e} {vs_ort:>12} {vs_cpu:>12}", e.checks.len());
    }
    kinds
}

#[test]
fn light_variants_fused_match_onnxruntime_logits() {
    light_variants_in("fused");
}

/// Unfused, every kind of kernel the light models have runs.
#[test]
fn light_variants_unfused_match_onnxruntime_logits() {
    let kinds = light_variants_in("unfused");
    for k in ["conv", "gemm", "maxpool", "avgpool", "gap", "lrn", "concat2", "transpose", "bn"] {
        assert!(kinds.iter().any(|x| x.starts_with(k)), "no {k} kernel ran: {kinds:?}");
    }
    assert!(kinds.contains("ew_v4") && kinds.contains("ew"), "both elementwise paths (float4 and scalar) should run: {kinds:?}");
}

#[test]
fn light_variants_in_tf32_match_the_reference_and_onnxruntime() {
    light_variants_in("tf32");
}

#[test]
fn light_variants_in_mixed_f16_match_the_reference_and_onnxruntime() {
    light_variants_in("mixed-f16");
}

#[test]
fn light_variants_in_mixed_bf16_match_the_reference_and_onnxruntime() {
    light_variants_in("mixed-bf16");
}

/// Kernel variants are names without shapes and tiles (and, to choose
/// among the tensor-core configurations, without operand types).
#[test]
fn kernel_variants_drop_shapes_and_tiles() {
    for (name, want) in [
        ("conv3x3_bias_relu_n1c64h55w55_m192_tf32_to_nchw", "conv3x3_bias_relu_tf32_to_nchw"),
        ("conv1x1_bias_relu_n1c64h112w112_m128_bf16_t128x128_to_nhwc", "conv1x1_bias_relu_bf16_to_nhwc"),
        ("gemm_tb_relu_m1n4096k25088", "gemm_tb_relu"),
        ("gemm_tbn1000k1024", "gemm_tb"),
        ("transpose_02134_1x68x4x14x14_f16", "transpose_f16"),
        ("softmax_a1_1x1000", "softmax_a1"),
        ("maxpool3x3s2_1x64x56x56", "maxpool3x3s2"),
        ("ew_relu_v4", "ew_relu_v4"),
    ] {
        assert_eq!(variant_of(name), want, "{name}");
    }
    assert_eq!(typeless("conv1x1_bias_relu_bf16_to_nhwc"), "conv1x1_bias_relu_to_nhwc");
    assert_eq!(typeless("conv1x1_bias_relu_xf16"), "conv1x1_bias_relu_x");
    assert_eq!(typeless("ew_cast_f16"), "ew_cast");
}

/// A batch of two different images (a kernel that mixed up rows would
/// pass with identical ones) against onnxruntime's logits of each.
#[test]
fn batches_of_different_images_match_onnxruntime() {
    for name in ["squeezenet", "resnet50", "inception_v1", "bvlc_alexnet"] {
        let plain = common::logits(common::load(common::variant(name).join("model.onnx").to_str().unwrap(), Some(2)));
        let x = tensor(name, "batch_input.pb");
        let want = tensor(name, "batch_logits.pb");
        let e = emulate(&plain, false, "f32", std::slice::from_ref(&x));
        assert_kernels_agree(name, &e);
        let got = e.outputs[0].to_f32_vec();
        let half = got.len() / 2;
        assert!(got[..half] != got[half..], "{name}: both rows are equal: the batch proves nothing");
        let x = common::excess(&e.outputs[0], &want, 1e-3, 1e-4);
        println!("{name} batch 2: {x:.3} of the tolerance");
        assert!(x <= 1.0, "{name} batch 2: logits differ from onnxruntime's ({x:.2} times the tolerance)");
    }
}

/// The torchvision-style zoo models (MobileNet v2: depthwise and grouped
/// convs, clip, global pooling; ResNet-50 at batch 2), in f32 and in the
/// reduced policies, against the CPU reference executor.
#[test]
fn zoo_models_match_the_reference_executor() {
    for (spec, batch, policy) in [
        ("zoo:mobilenet_v2", 1, "f32"),
        ("zoo:mobilenet_v2", 1, "mixed-bf16"),
        ("zoo:mobilenet_v2", 1, "f16"),
        ("zoo:resnet50", 2, "f32"),
        ("zoo:resnet50", 1, "mixed-f16"),
    ] {
        let what = format!("{spec} batch {batch} {policy}");
        let mut plain = common::load(spec, Some(batch));
        smelt::fill_missing_weights(&mut plain);
        let plain = common::logits(plain);
        let x = common::random_inputs(&plain, 7);
        let e = emulate(&plain, false, policy, &x);
        assert_kernels_agree(&what, &e);
        let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
        let r = smelt::precision_error(&e.outputs[0], &want[0]);
        assert!(r.max_abs_over_range <= 1e-3, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        if policy == "f32" {
            // In exact f32 every element, small ones too, within 1e-4 of
            // itself (sums in another order) plus 1e-6 of the range.
            let x = common::excess(&e.outputs[0], &want[0], 1e-4, 1e-6);
            assert!(x <= 1.0, "{what}: an element differs from the reference by {x:.2} times rtol 1e-4 + 1e-6 of range");
        }
    }
}

/// Under mixed precision ResNet-50's activations stay channels-last from
/// the first bottleneck to the last (the stem's conv writes NCHW for the
/// max pool, the last conv NCHW for the average pool): every kernel reads
/// each activation in the layout its producer wrote, every channels-last x
/// comes with its weights permuted in the blob, and the program computes
/// what the reference executor does (checked kernel by kernel on the
/// emulator in `zoo_models_match_the_reference_executor`).
#[test]
fn channels_last_runs_between_tensor_core_convs() {
    use smelt_codegen::kernel::Kernel;
    let mut plain = common::load("zoo:resnet50", Some(1));
    smelt::fill_missing_weights(&mut plain);
    let opts = smelt::Options {
        precision: smelt_passes::precision::Options { policy: "mixed-f16".parse().unwrap(), keep_f32: vec![], tf32: smelt_ir::Tf32::Off },
        ..Default::default()
    };
    let mut s = common::session(&plain, opts);
    let compiled = s.compile().unwrap_or_else(|e| panic!("{e}"));
    let planned = s.plan(&compiled).unwrap_or_else(|e| panic!("{e}"));
    let program = s.program(&compiled, &planned).unwrap_or_else(|e| panic!("{e}"));
    assert_layouts_agree(&program);
    let convs: Vec<&smelt_codegen::conv::Conv> =
        program.steps.iter().filter_map(|st| if let Kernel::Conv(c) = &st.kernel { Some(c) } else { None }).collect();
    let (first, last) = (convs[0], convs[convs.len() - 1]);
    assert!(!first.x_nhwc && !first.out_nhwc, "the stem conv reads the input and feeds the max pool: {}", first.name);
    assert!(last.x_nhwc && !last.out_nhwc, "the last conv feeds the average pool: {}", last.name);
    let inside = convs.iter().filter(|c| c.x_nhwc && c.out_nhwc).count();
    assert!(4 * inside >= 3 * convs.len(), "{inside} of {} convs channels-last in and out", convs.len());
    let permuted = program.weights.iter().filter(|w| w.channels_last).count();
    assert_eq!(permuted, convs.iter().filter(|c| c.x_nhwc).count(), "one permuted weight per channels-last x");
}

/// Asserts every kernel of `program` reads and writes each value in the
/// layout memory holds it in: the layout its producer wrote (graph inputs
/// NCHW), or the weights blob's.
fn assert_layouts_agree(program: &smelt_codegen::Program) {
    use smelt_codegen::kernel::Kernel;
    let mut written = std::collections::HashMap::new();
    for st in &program.steps {
        let (x_nhwc, out_nhwc) = if let Kernel::Conv(c) = &st.kernel { (c.x_nhwc, c.out_nhwc) } else { (false, false) };
        let n = st.args.len();
        for (i, a) in st.args.iter().enumerate() {
            let reads = match &st.kernel {
                Kernel::Conv(_) if i == 0 => x_nhwc,
                // The weights, permuted in the blob with a channels-last x.
                Kernel::Conv(_) if i == 1 => x_nhwc,
                Kernel::Conv(c) if i == n - 1 || (c.residual && i == n - 2) => out_nhwc,
                _ => false,
            };
            let holds = if i == n - 1 { a.channels_last } else { *written.get(&a.value).unwrap_or(&a.channels_last) };
            assert_eq!(holds, reads, "{} reads or writes {} ({}) in the wrong layout", st.kernel.name(), a.value, a.ty);
        }
        written.insert(st.args[n - 1].value.clone(), out_nhwc);
    }
}

/// Random graphs of every kernel kind (see `common::random_kernel_graph`)
/// with several outputs, and the older random graphs (residual blocks),
/// under every policy, fused and not, against the CPU reference executor.
#[test]
fn random_graphs_match_the_reference_executor() {
    let policies = ["f32", "mixed-f16", "mixed-bf16", "f16", "bf16"];
    let graphs: Vec<(u64, Graph)> =
        (0..60u64).map(|s| (s, common::random_kernel_graph(s))).chain((0..20u64).map(|s| (s, common::random_graph(s)))).collect();
    // Every program's kernels compiled first, in batches on all cores.
    let programs: Vec<smelt_codegen::Program> = graphs
        .iter()
        .flat_map(|(seed, g)| [false, true].map(|no_fuse| program(g, options(no_fuse, policies[*seed as usize % policies.len()])).0))
        .collect();
    smelt_runtime::emu::precompile(&programs).unwrap_or_else(|e| panic!("{e}"));
    drop(programs);
    for (seed, g) in graphs {
        let x = common::random_inputs(&g, seed);
        let policy = policies[seed as usize % policies.len()];
        for no_fuse in [false, true] {
            let what = format!("random graph {seed} ({policy}, {})", if no_fuse { "unfused" } else { "fused" });
            let e = emulate(&g, no_fuse, policy, &x);
            assert_kernels_agree(&what, &e);
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            // Fused kernels keep f32 in registers where the reference
            // executor rounds after every op: under a half policy, a few
            // units in the last place (as tests/precision.rs allows).
            let budget = if policy == "f32" { 1e-4 } else { 2e-2 };
            for (got, want) in common::paired(&e.outputs, &want) {
                let r = smelt::precision_error(got, want);
                assert!(r.max_abs_over_range <= budget, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
                if policy == "f32" {
                    // Exact f32: every element, small ones too.
                    let x = common::excess(got, want, 1e-4, 1e-6);
                    assert!(x <= 1.0, "{what}: an element differs from the reference by {x:.2} times rtol 1e-4 + 1e-6 of range");
                }
            }
        }
    }
}

/// A graph of one input of `shape`, `op` of it (after a relu with `relu_first`).
fn chain(shape: &[usize], op: impl Fn(&mut Builder, ValueId) -> Result<ValueId, smelt_ir::IrError>, relu_first: bool) -> Graph {
    let mut b = Builder::new(1);
    let mut x = b.input("x", shape).unwrap();
    if relu_first {
        x = b.relu(x).unwrap();
    }
    let y = op(&mut b, x).unwrap();
    b.finish("y", y).unwrap()
}

/// A program of `g` (fused, f32) ready for the emulator, with its blob.
fn program_of(g: &Graph) -> (smelt_codegen::Program, Vec<u8>) {
    let (program, c) = program(g, smelt::Options::default());
    let blob = program.weights_blob(&c.graph).unwrap();
    (program, blob)
}

fn emulator_error(program: smelt_codegen::Program, blob: &[u8], inputs: &[Tensor]) -> String {
    let mut exec = smelt_runtime::emu::executor(program, blob, &|_| {}).unwrap();
    match exec.run(inputs, false) {
        Ok(_) => panic!("the emulator accepted a broken program"),
        Err(e) => e.to_string(),
    }
}

/// An access outside an argument's planned extent is an error naming the
/// kernel, the parameter, the index, the thread and the block.
#[test]
fn out_of_bounds_access_names_kernel_thread_and_block() {
    let g = chain(&[1, 1, 3, 5], |b, x| b.op(Op::Unary(smelt_ir::UnaryOp::Sigmoid), &[x]), true);
    let (mut program, blob) = program_of(&g);
    let x = common::random_inputs(&g, 1);
    let step = &mut program.steps[0];
    let out = step.args.last_mut().unwrap();
    out.bytes -= 4; // the plan now gives the output one element less
    let msg = emulator_error(program, &blob, &x);
    println!("{msg}");
    assert!(msg.contains("outside its argument") && msg.contains("thread (14,0,0) of block (0,0,0)") && msg.contains("out["), "{msg}");
}

/// `__restrict__` on a parameter whose argument overlaps a written one is
/// refused before the launch.
#[test]
fn overlapping_restrict_arguments_are_refused() {
    let g = chain(&[1, 4, 6, 6], |b, x| b.max_pool(x, 2, 2, 0), false);
    let (mut program, blob) = program_of(&g);
    let x = common::random_inputs(&g, 1);
    let step = &mut program.steps[0];
    let (src, dst) = (step.args[0].offset, step.args[1].offset);
    step.args[1].offset = src;
    assert_ne!(src, dst);
    let msg = emulator_error(program, &blob, &x);
    assert!(msg.contains("overlap in memory") && msg.contains("__restrict__"), "{msg}");
}

/// A float4 parameter off a 16-byte boundary is an error (a GPU faults).
#[test]
fn misaligned_vector_parameters_are_refused() {
    let g = chain(&[1, 4, 8, 8], |b, x| b.relu(x), false);
    let (mut program, blob) = program_of(&g);
    let x = common::random_inputs(&g, 1);
    let step = &mut program.steps[0];
    assert!(step.kernel.name().ends_with("_v4"), "{}", step.kernel.name());
    step.args[1].offset += 4;
    step.args[1].bytes -= 16;
    let msg = emulator_error(program, &blob, &x);
    assert!(msg.contains("not aligned to 16 bytes"), "{msg}");
}

/// Compiles a hand-written kernel for the emulator.
fn hand_written(name: &str, source: &str) -> smelt_runtime::emu::EmuKernel {
    smelt_runtime::emu::EmuCompiler::new().unwrap().compile(name, source).unwrap_or_else(|e| panic!("{e}"))
}

/// Kernels compiled together share one unit and one shared object, each
/// in its own namespace: two kernels of the same name, with helpers and
/// macros of the same names, each compute its own; a batch with a kernel
/// the compiler rejects names that kernel, and the others still compile.
#[test]
fn kernels_compiled_in_one_batch_stay_apart() {
    use smelt_runtime::emu::{launch_raw, EmuCompiler, KernelSource, Level, RawArg};
    let source = |k: f32| {
        format!(
            "#include <cuda_fp16.h>\n#define SCALE {k:.1}f\n__device__ float twice(float x) {{ return 2.0f * x; }}\n\
             extern \"C\" __global__ void batched(float* __restrict__ out, unsigned long long n) {{\n\
             \x20   unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;\n\
             \x20   if (i < n) out[i] = twice(SCALE) + (float)i;\n}}\n"
        )
    };
    let emu = EmuCompiler::new().unwrap();
    let ks: Vec<KernelSource> = [3.0, 5.0].map(|k| KernelSource::new("batched", source(k), Level::O1)).into();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let done = emu.compile_many(&ks, 1, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done[0].library(), done[1].library(), "one shared object for the batch");
    for (k, want) in done.iter().zip([6.0f32, 10.0]) {
        let mut out = vec![0u8; 4 * 40];
        launch_raw(k, [2, 1, 1], [32, 1, 1], &mut [RawArg::Buffer(&mut out), RawArg::Count(40)]).unwrap_or_else(|e| panic!("{e}"));
        let got = f32s(&out);
        assert!(got.iter().enumerate().all(|(i, &v)| v == want + i as f32), "{want}: {got:?}");
    }
    // One kernel the compiler rejects, beside one it takes.
    let bad = "extern \"C\" __global__ void broken(float* __restrict__ out, unsigned long long n) { out[0] = undeclared; }\n";
    let ks = vec![KernelSource::new("broken", bad, Level::O1), KernelSource::new("batched", source(7.0), Level::O1)];
    let e = emu.compile_many(&ks, 1, &|_| {}).expect_err("a kernel that does not compile").to_string();
    assert!(e.contains("kernel broken") && e.contains("undeclared"), "{e}");
    let good = emu.compile_many(&ks[1..], threads, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(good.len(), 1);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Warp operations with CUDA's semantics: a tree reduction with
/// `__shfl_down_sync` per warp, a butterfly with `__shfl_xor_sync`, a
/// broadcast with `__shfl_sync`, and `__ballot_sync`, over three warps.
#[test]
fn warp_shuffles_and_votes() {
    use smelt_runtime::emu::{launch_raw, RawArg};
    let src = r#"
extern "C" __global__ void warps(const float* __restrict__ x, float* __restrict__ out, unsigned long long n) {
    unsigned int t = threadIdx.x, lane = t % 32, w = t / 32;
    float v = t < n ? x[t] : 0.0f;
    float sum = v;
    for (int d = 16; d > 0; d /= 2) sum += __shfl_down_sync(0xffffffffu, sum, d);
    float all = v;
    for (int m = 1; m < 32; m *= 2) all += __shfl_xor_sync(0xffffffffu, all, m);
    float first = __shfl_sync(0xffffffffu, v, 0);
    unsigned int positive = __ballot_sync(0xffffffffu, v > 0.0f);
    out[t * 4 + 0] = lane == 0 ? sum : 0.0f;
    out[t * 4 + 1] = all;
    out[t * 4 + 2] = first;
    out[t * 4 + 3] = (float)__popc(positive);
    (void)w;
}
"#;
    let k = hand_written("warps", src);
    let (n, threads) = (80usize, 96usize); // three warps; the third's last 16 lanes read no input
    let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32) - 5.0).collect();
    let mut xb = f32_bytes(&x);
    let mut out = vec![0u8; threads * 16];
    let args = &mut [RawArg::Buffer(&mut xb), RawArg::Buffer(&mut out), RawArg::Count(n as u64)];
    launch_raw(&k, [1, 1, 1], [threads as u32, 1, 1], args).unwrap_or_else(|e| panic!("{e}"));
    let out = f32s(&out);
    for w in 0..threads / 32 {
        let lanes: Vec<f32> = (w * 32..w * 32 + 32).map(|i| x.get(i).copied().unwrap_or(0.0)).collect();
        let total: f32 = lanes.iter().sum();
        assert_eq!(out[w * 32 * 4], total, "warp {w}: shfl_down sum");
        for l in 0..32 {
            let t = w * 32 + l;
            assert_eq!(out[t * 4 + 1], total, "lane {t}: xor butterfly");
            assert_eq!(out[t * 4 + 2], lanes[0], "lane {t}: broadcast");
            assert_eq!(out[t * 4 + 3], lanes.iter().filter(|&&v| v > 0.0).count() as f32, "lane {t}: ballot");
        }
    }
}

/// A 16x16x16 tensor-core product through `nvcuda::wmma` (half inputs, f32
/// accumulation, B column-major, C loaded and D stored row-major) equals
/// the product computed here.
#[test]
fn wmma_fragments_multiply_tiles() {
    use smelt_runtime::emu::{launch_raw, RawArg};
    let src = r#"
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void tile(const __half* __restrict__ a, const __half* __restrict__ b, const float* __restrict__ c, float* __restrict__ d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = 2.0f * acc.x[i];
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
"#;
    let k = hand_written("tile", src);
    let half = |v: f32| half::f16::from_f32(v);
    let a: Vec<half::f16> = (0..256).map(|i| half(((i * 7 % 13) as f32 - 6.0) / 8.0)).collect();
    let b: Vec<half::f16> = (0..256).map(|i| half(((i * 5 % 9) as f32 - 4.0) / 4.0)).collect(); // column-major
    let c: Vec<f32> = (0..256).map(|i| (i % 7) as f32 * 0.25).collect();
    let mut ab: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut cb = f32_bytes(&c);
    let mut d = vec![0u8; 1024];
    launch_raw(
        &k,
        [1, 1, 1],
        [32, 1, 1],
        &mut [RawArg::Buffer(&mut ab), RawArg::Buffer(&mut bb), RawArg::Buffer(&mut cb), RawArg::Buffer(&mut d)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = f32s(&d);
    for i in 0..16 {
        for j in 0..16 {
            let mut acc = c[i * 16 + j];
            for kk in 0..16 {
                acc += a[i * 16 + kk].to_f32() * b[j * 16 + kk].to_f32();
            }
            assert_eq!(d[i * 16 + j], 2.0 * acc, "d[{i}][{j}]");
        }
    }
    // A fragment is the warp's: one that differs between lanes is an error.
    let bad = hand_written(
        "lanes",
        &src.replace("extern \"C\" __global__ void tile", "extern \"C\" __global__ void lanes")
            .replace("wmma::mma_sync(acc, fa, fb, acc);", "acc.x[0] = (float)threadIdx.x;\n    wmma::mma_sync(acc, fa, fb, acc);"),
    );
    let mut d = vec![0u8; 1024];
    let e = launch_raw(
        &bad,
        [1, 1, 1],
        [32, 1, 1],
        &mut [RawArg::Buffer(&mut ab), RawArg::Buffer(&mut bb), RawArg::Buffer(&mut cb), RawArg::Buffer(&mut d)],
    )
    .expect_err("lane-dependent fragments must be refused")
    .to_string();
    assert!(e.contains("operands differ"), "{e}");
}

/// Threads of a warp at different barriers (half at `__syncthreads`, half
/// at `__syncwarp`) are reported as a deadlock, not a hang.
/// A block whose threads overwrite shared memory that others still read,
/// with no barrier between: the schedules of the emulator give different
/// bytes (each an order a GPU may take), so the tests that compare them
/// detect the race; with the barrier every schedule gives the same bytes.
#[test]
fn missing_barriers_show_as_different_bytes_between_schedules() {
    use smelt_runtime::emu::{launch_raw_scheduled, RawArg};
    let source = |barrier: &str| {
        format!(
            "extern \"C\" __global__ void racy(const float* __restrict__ x, float* __restrict__ y) {{\n\
             __shared__ float s[128];\n\
             unsigned int t = threadIdx.x;\n\
             s[t] = x[t];\n\
             __syncthreads();\n\
             float v = s[(t + 32) % 128];\n\
             {barrier}\n\
             s[t] = 2.0f * v;\n\
             __syncthreads();\n\
             y[t] = s[(t + 64) % 128] + v;\n\
             }}\n"
        )
    };
    let x: Vec<f32> = (0..128).map(|i| i as f32).collect();
    for (barrier, racy) in [("", true), ("__syncthreads();", false)] {
        let k = hand_written("racy", &source(barrier));
        let mut outputs = Vec::new();
        for schedule in Schedule::ALL {
            let mut xs = f32_bytes(&x);
            let mut y = vec![0u8; 512];
            launch_raw_scheduled(&k, ([1, 1, 1], [128, 1, 1]), &mut [RawArg::Buffer(&mut xs), RawArg::Buffer(&mut y)], schedule).unwrap();
            outputs.push(f32s(&y));
        }
        let want: Vec<f32> = (0..128).map(|t| 2.0 * x[(t + 96) % 128] + x[(t + 32) % 128]).collect();
        if racy {
            assert!(outputs.iter().any(|o| o != &outputs[0]), "the race gives the same bytes in every schedule");
        } else {
            assert!(outputs.iter().all(|o| o == &want), "with the barrier: {:?}", &outputs);
        }
    }
}

#[test]
fn divergent_barriers_are_reported() {
    use smelt_runtime::emu::{launch_raw, RawArg};
    let src = r#"
extern "C" __global__ void diverge(float* __restrict__ out) {
    if (threadIdx.x < 16) __syncthreads(); else __syncwarp();
    out[threadIdx.x] = 1.0f;
}
"#;
    let k = hand_written("diverge", src);
    let mut out = vec![0u8; 128];
    let e = launch_raw(&k, [1, 1, 1], [32, 1, 1], &mut [RawArg::Buffer(&mut out)]).expect_err("a divergent barrier");
    assert!(e.to_string().contains("deadlocks"), "{e}");
}

/// Tensor-core kernels (f16 and bf16 convolutions and GEMMs on `wmma`), on
/// shapes that are not multiples of the tiles: a 3-channel first layer
/// (depth 27), a strided 1x1, a grouped conv, a residual block (bias,
/// residual and activation fused), a linear layer, a Gemm with both
/// operands transposed and a scale, a batched MatMul with a broadcast
/// operand. Each kernel equals its description (the fragments accumulate in
/// ascending k, as the description does) and the outputs the CPU reference
/// executor's.
#[test]
fn tensor_core_kernels_match_their_descriptions() {
    use smelt_codegen::kernel::Kernel;
    let graphs = product_graphs();
    for (what, g) in &graphs {
        let x = common::random_inputs(g, 3);
        for policy in ["f16", "bf16"] {
            let what = format!("{what} ({policy})");
            let e = emulate_in_every_order(g, policy, &x);
            assert_kernels_agree(&what, &e);
            let mut products = 0;
            for id in e.graph.node_ids() {
                match kernel_of(&e.graph, id, &Default::default()) {
                    Some(Kernel::Conv(c)) => {
                        assert!(c.tensor_cores(), "{what}: {} is not on tensor cores", c.name);
                        products += 1;
                    }
                    Some(Kernel::Gemm(m)) => {
                        assert!(m.tensor_cores, "{what}: {} is not on tensor cores", m.name);
                        products += 1;
                    }
                    _ => {}
                }
            }
            assert_eq!(products, 1, "{what}: one product kernel");
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            let r = smelt::precision_error(&e.outputs[0], &want[0]);
            assert!(r.max_abs_over_range <= 1e-2, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
}

/// Layer norms and softmaxes over rows of a few hundred are normalized by a
/// block each (a tree fold in shared memory): they match their
/// descriptions and the CPU reference, a fused prologue included, with
/// rows that are and are not a multiple of the block.
#[test]
fn block_per_row_norms_match_their_descriptions() {
    use smelt_codegen::kernel::Kernel;
    let layer_norm = |b: &mut Builder, x: ValueId, n: usize| {
        let scale = b.weight("scale".into(), &[n], |r| 1.0 + 0.1 * r.normal());
        let bias = b.weight("bias".into(), &[n], |r| 0.1 * r.normal());
        b.op(Op::LayerNorm { axis: 2, epsilon: 1e-5 }, &[x, scale, bias])
    };
    let graphs: Vec<(&str, Graph)> = vec![
        ("layer norm of 768", chain(&[2, 5, 768], |b, x| layer_norm(b, x, 768), false)),
        ("relu then layer norm of 300", chain(&[3, 4, 300], |b, x| layer_norm(b, x, 300), true)),
        ("softmax of 1000", chain(&[4, 1000], |b, x| b.softmax(x), false)),
        ("relu then softmax of 257", chain(&[2, 3, 257], |b, x| b.softmax(x), true)),
    ];
    for (what, g) in &graphs {
        let x = common::random_inputs(g, 5);
        for policy in ["f32", "f16"] {
            let what = format!("{what} ({policy})");
            let e = emulate_in_every_order(g, policy, &x);
            assert_kernels_agree(&what, &e);
            let blocks: Vec<Kernel> = e
                .graph
                .node_ids()
                .filter_map(|id| kernel_of(&e.graph, id, &Default::default()))
                .filter(|k| matches!(k, Kernel::Reduction(r) if r.by_block()))
                .collect();
            assert_eq!(blocks.len(), 1, "{what}: one normalization by block");
            // Its CUDA C compiles with NVRTC too.
            if let Some(nv) = common::nvrtc_compiler("emulator") {
                nv.compile(blocks[0].name(), &blocks[0].cuda()).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            let r = smelt::precision_error(&e.outputs[0], &want[0]);
            let tol = if policy == "f32" { 1e-5 } else { 1e-2 };
            assert!(r.max_abs_over_range <= tol, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
}

/// Fused attention on tensor cores (f16 and bf16 operands, head dims of 32,
/// 64 and 128, so 64, 32 and 16 query rows per block): queries and keys
/// that are not whole tiles, a scale, an additive padding mask and a causal
/// mask of -inf. Each kernel equals its description (scores and `p @ v` from
/// fragments, the online softmax once per 32-key tile) and the output the
/// CPU reference executor's softmax-then-matmul; the CUDA C compiles with
/// NVRTC.
#[test]
fn attention_on_tensor_cores_matches_its_description() {
    use smelt_codegen::kernel::Kernel;
    // q [b, h, sq, d] is the input; k, v and the mask are weights.
    let attention = |b: usize, h: usize, (sq, sk): (usize, usize), d: usize, causal: bool| {
        chain(
            &[b, h, sq, d],
            move |g, q| {
                let k = g.weight("k".into(), &[b, h, sk, d], |r| r.normal());
                let v = g.weight("v".into(), &[b, h, sk, d], |r| r.normal());
                let kt = g.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k])?;
                let s = g.op(Op::MatMul, &[q, kt])?;
                let scale = g.constant("scale".into(), Tensor::from_f32(vec![], vec![1.0 / (d as f32).sqrt()]));
                let s = g.op(Op::Binary(smelt_ir::BinaryOp::Mul), &[s, scale])?;
                let mask = if causal {
                    let m = (0..sq * sk).map(|f| if f % sk > f / sk + sk - sq { f32::NEG_INFINITY } else { 0.0 }).collect();
                    g.constant("mask".into(), Tensor::from_f32(vec![1, 1, sq, sk], m))
                } else {
                    // The last keys of the second sequence are padding.
                    let m = (0..b * sk).map(|f| if f / sk == 1 && f % sk >= sk - 5 { -10000.0 } else { 0.0 }).collect();
                    g.constant("mask".into(), Tensor::from_f32(vec![b, 1, 1, sk], m))
                };
                let s = g.op(Op::Binary(smelt_ir::BinaryOp::Add), &[s, mask])?;
                let p = g.softmax(s)?;
                g.op(Op::MatMul, &[p, v])
            },
            false,
        )
    };
    let graphs: Vec<(&str, Graph, usize)> = vec![
        ("d32 padded", attention(2, 3, (40, 50), 32, false), 64),
        ("d64 causal", attention(1, 2, (77, 77), 64, true), 32),
        ("d128 padded", attention(2, 1, (20, 33), 128, false), 16),
    ];
    for (what, g, rows) in &graphs {
        let x = common::random_inputs(g, 7);
        for policy in ["f16", "bf16"] {
            let what = format!("{what} ({policy})");
            let e = emulate_in_every_order(g, policy, &x);
            assert_kernels_agree(&what, &e);
            let fused: Vec<Kernel> = e
                .graph
                .node_ids()
                .filter_map(|id| kernel_of(&e.graph, id, &Default::default()))
                .filter(|k| matches!(k, Kernel::Attention(_)))
                .collect();
            assert_eq!(fused.len(), 1, "{what}: one fused attention");
            let Kernel::Attention(a) = &fused[0] else { unreachable!() };
            assert_eq!(a.tc_rows, Some(*rows), "{what}: {} on tensor cores", a.name);
            if let Some(nv) = common::nvrtc_compiler("emulator") {
                nv.compile(&a.name, &fused[0].cuda()).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            let r = smelt::precision_error(&e.outputs[0], &want[0]);
            assert!(r.max_abs_over_range <= 1e-2, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
}

/// One conv or GEMM product each: convs (3 input channels, strided 1x1,
/// grouped, a residual block with its folded batch norm, residual and
/// activation fused), a linear layer, a Gemm with both operands transposed
/// and a scale, a batched MatMul with a broadcast operand.
fn product_graphs() -> Vec<(&'static str, Graph)> {
    vec![
        ("conv3x3 of 3 channels", chain(&[2, 3, 9, 11], |b, x| b.conv(x, 20, 3, 1, 1), false)),
        ("strided conv1x1 + relu", chain(&[1, 24, 10, 10], |b, x| b.conv(x, 72, 1, 2, 0).and_then(|y| b.relu(y)), false)),
        ("grouped conv", chain(&[1, 32, 7, 7], |b, x| b.conv_g(x, 32, 3, 1, 1, 2), false)),
        (
            "residual block",
            chain(
                &[1, 16, 8, 8],
                |b, x| {
                    let y = b.conv(x, 16, 3, 1, 1)?;
                    let y = b.batch_norm(y, 1.0)?;
                    let y = b.add(y, x)?;
                    b.relu(y)
                },
                false,
            ),
        ),
        ("linear", chain(&[3, 40], |b, x| b.linear(x, 70), false)),
        (
            "gemm of transposes",
            chain(
                &[40, 5],
                |b, x| {
                    let w = b.weight("w".into(), &[70, 40], |r| r.normal());
                    b.op(Op::Gemm { trans_a: true, trans_b: true, alpha: 0.5, beta: 1.0 }, &[x, w])
                },
                false,
            ),
        ),
        (
            "batched matmul",
            chain(
                &[2, 3, 17, 24],
                |b, x| {
                    let w = b.weight("w".into(), &[24, 33], |r| r.normal());
                    b.op(Op::MatMul, &[x, w])
                },
                false,
            ),
        ),
    ]
}

/// The same products in f32 with `--tf32 on`: every conv and GEMM on
/// tensor cores in TF32 (16x16x8 fragments, operands rounded to TF32 by
/// `__float_to_tf32`), bit-level against its description (which rounds as
/// `cvt.rna` does) and within TF32's error of the f32 reference (1e-3 of
/// range); `--tf32 conv` (the default) leaves the GEMMs in f32 and `off`
/// everything.
#[test]
fn tf32_kernels_match_their_descriptions() {
    use smelt_codegen::kernel::Kernel;
    for (what, g) in &product_graphs() {
        let x = common::random_inputs(g, 3);
        for tf32 in [smelt_ir::Tf32::On, smelt_ir::Tf32::Conv, smelt_ir::Tf32::Off] {
            let what = format!("{what} (--tf32 {tf32})");
            let opts = smelt::Options { precision: smelt_passes::precision::Options { tf32, ..Default::default() }, ..Default::default() };
            let e = emulate_in(g, opts, &x, &Schedule::ALL);
            assert_kernels_agree(&what, &e);
            let mut products = 0;
            for id in e.graph.node_ids() {
                let want = match kernel_of(&e.graph, id, &Default::default()) {
                    Some(Kernel::Conv(_)) => tf32.convs(),
                    Some(Kernel::Gemm(_)) => tf32.gemms(),
                    _ => continue,
                };
                let k = kernel_of(&e.graph, id, &Default::default()).unwrap();
                assert_eq!((k.tensor_cores(), k.tf32()), (want, want), "{what}: {}", k.name());
                if want {
                    assert!(k.cuda().contains("wmma::precision::tf32"), "{what}: {}", k.name());
                    if let Some(nv) = common::nvrtc_compiler("emulator") {
                        nv.compile(k.name(), &k.cuda()).unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                }
                products += 1;
            }
            assert_eq!(products, 1, "{what}: one product kernel");
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            let r = smelt::precision_error(&e.outputs[0], &want[0]);
            let tol = if tf32 == smelt_ir::Tf32::Off { 1e-5 } else { 1e-3 };
            assert!(r.max_abs_over_range <= tol, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
}

/// Convolution gradients in f16, bf16 and f32 (TF32, the GPU default) run
/// on tensor cores: the data gradient of a 3x3 conv (stride 1 and 2) and the
/// weight gradient of a 1x1 conv on 64x64 tiles, and 3x3 weight gradients
/// (stride 1 and 2, a sum that is not a whole number of steps) on 32x32
/// tiles whose warps split the sum in four; each equal to its description
/// (products summed in f32 in ascending k, the slices added in order) and
/// within half precision of the CPU reference executor's f32 run.
#[test]
fn convolution_gradients_on_tensor_cores_match_their_descriptions() {
    use smelt_codegen::kernel::Kernel;
    let conv = |s: usize, p: usize| smelt_ir::Conv { strides: vec![s, s], pads: vec![p; 4], dilations: vec![1, 1], group: 1 };
    let data = |side: usize, stride: usize| {
        chain(
            &[4, 32, side, side],
            move |b, dy| {
                let w = b.weight("w".into(), &[32, 64, 3, 3], |r| r.normal());
                b.op(Op::ConvGradData { conv: conv(stride, 1), shape: vec![4, 64, 64, 64] }, &[dy, w])
            },
            false,
        )
    };
    // Sums of 3 x 7 x 7 = 147: a step and a part.
    let weight = |side: usize, stride: usize| {
        chain(
            &[3, 96, side, side],
            move |b, x| {
                let dy = b.weight("dy".into(), &[3, 192, 7, 7], |r| r.normal());
                b.op(Op::ConvGradWeight { conv: conv(stride, 1), shape: vec![192, 96, 3, 3] }, &[x, dy])
            },
            false,
        )
    };
    let graphs: Vec<(&str, Graph)> = vec![
        ("3x3 data gradient", data(64, 1)),
        ("strided 3x3 data gradient", data(32, 2)),
        ("3x3 weight gradient, split sum", weight(7, 1)),
        ("strided 3x3 weight gradient, split sum", weight(13, 2)),
        (
            "1x1 weight gradient",
            chain(
                &[2, 1024, 7, 7],
                |b, x| {
                    let dy = b.weight("dy".into(), &[2, 1024, 7, 7], |r| r.normal());
                    b.op(Op::ConvGradWeight { conv: conv(1, 0), shape: vec![1024, 1024, 1, 1] }, &[x, dy])
                },
                false,
            ),
        ),
    ];
    for (what, g) in &graphs {
        let x = common::random_inputs(g, 11);
        for policy in ["f16", "bf16", "tf32"] {
            let what = format!("{what} ({policy})");
            let e = emulate_in_every_order(g, policy, &x);
            assert_kernels_agree(&what, &e);
            let grads: Vec<Kernel> = e
                .graph
                .node_ids()
                .filter_map(|id| kernel_of(&e.graph, id, &Default::default()))
                .filter(|k| matches!(k, Kernel::Grad(_)))
                .collect();
            assert_eq!(grads.len(), 1, "{what}: one gradient kernel");
            assert!(grads[0].tensor_cores(), "{what}: {} is not on tensor cores", grads[0].name());
            assert_eq!(grads[0].tf32(), policy == "tf32", "{what}: {}", grads[0].name());
            if let Some(nv) = common::nvrtc_compiler("emulator") {
                nv.compile(grads[0].name(), &grads[0].cuda()).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let want = smelt_runtime::cpu::run(&e.graph, &x).unwrap();
            let r = smelt::precision_error(&e.outputs[0], &want[0]);
            assert!(r.max_abs_over_range <= 1e-2, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
}

/// `t` (`[N, C, ...]`) laid out channels-last, `[N, ..., C]`.
fn channels_last(t: &Tensor) -> Tensor {
    let s = t.shape();
    let (n, c) = (s[0], s[1]);
    let taps: usize = s[2..].iter().product();
    let order: Vec<usize> = (0..n * taps * c).map(|i| (i / (taps * c) * c + i % c) * taps + i / c % taps).collect();
    t.take(&order, smelt_codegen::conv::channels_last_shape(s))
}

/// Every tensor-core tile the cost model may choose (64x64, 128x64 and
/// 64x128 on 4 warps, 128x128 on 8 with its results staged a row of warps
/// at a time) computes each conv and GEMM of [`product_graphs`], and a conv
/// and a GEMM a few tiles wide whose edges fall inside tiles, bit for bit as
/// its description does, in f16, bf16 and TF32, in every [`Schedule`] of a
/// block's threads (so no barrier is missing); each tile's kernel also
/// compiles with NVRTC. Each conv also runs channels-last (x and output,
/// either alone: its operands permuted, 16-byte loads where the channels
/// allow), bit for bit as its description, and its description within a
/// rounding of the NCHW one's (the same products summed in another order).
#[test]
fn every_tensor_core_tile_matches_its_description() {
    use smelt_codegen::kernel::Kernel;
    use smelt_codegen::tile::Tile;
    use smelt_runtime::emu::{launch_raw_scheduled, EmuCompiler, KernelSource, Level, RawArg};
    let mut graphs = product_graphs();
    graphs.push(("wide conv", chain(&[2, 24, 12, 11], |b, x| b.conv(x, 136, 3, 1, 1).and_then(|y| b.relu(y)), false)));
    graphs.push(("wide linear", chain(&[150, 40], |b, x| b.linear(x, 140), false)));
    graphs.push(("strided conv7x7 of 16 channels", chain(&[1, 16, 15, 13], |b, x| b.conv(x, 32, 7, 2, 3), false)));
    graphs.push((
        "batched matmul of whole vectors",
        chain(
            &[2, 24, 40],
            |b, x| {
                let w = b.weight("w".into(), &[40, 72], |r| r.normal());
                b.op(Op::MatMul, &[x, w])
            },
            false,
        ),
    ));
    let emu = EmuCompiler::new().unwrap();
    let nv = common::nvrtc_compiler("tiles");
    let mut r = smelt_ir::Rng::new(7);
    let mut seen = BTreeSet::new();
    let mut vector_loads = BTreeSet::new();
    let mut gemm_loads = BTreeSet::new();
    // (what, the kernel on its tile, its operands' bytes, its description's output)
    let mut cases: Vec<(String, Kernel, Vec<Vec<u8>>, Vec<u8>)> = Vec::new();
    for (what, g) in &graphs {
        for policy in ["f16", "bf16", "tf32"] {
            let (precision, tf32) = if policy == "tf32" { ("f32", smelt_ir::Tf32::On) } else { (policy, smelt_ir::Tf32::Off) };
            let precision = smelt_passes::precision::Options { policy: precision.parse().unwrap(), keep_f32: vec![], tf32 };
            let graph = common::session(g, smelt::Options { precision, ..Default::default() }).compile().unwrap_or_else(|e| panic!("{e}"));
            let graph = graph.graph;
            for id in graph.node_ids() {
                let Some(k) = kernel_of(&graph, id, &Default::default())
                    .filter(|k| k.tensor_cores() && matches!(k, Kernel::Conv(_) | Kernel::Gemm(_)))
                else {
                    continue;
                };
                let inputs: Vec<Tensor> = graph
                    .inputs_of(id)
                    .iter()
                    .map(|v| {
                        let ty = graph.ty(*v);
                        Tensor::from_f32(ty.shape.clone(), (0..ty.numel()).map(|_| r.normal()).collect()).cast(ty.dtype)
                    })
                    .collect();
                let nchw = k.run_cpu(&inputs.iter().collect::<Vec<_>>());
                let layouts: &[(bool, bool)] = if matches!(k, Kernel::Conv(_)) {
                    &[(false, false), (true, true), (false, true), (true, false)]
                } else {
                    &[(false, false)]
                };
                for &(x_nhwc, out_nhwc) in layouts {
                    // The operands as the layout holds them: x, the weights
                    // (with x) and the residual (with the output) channels-last.
                    let mut k = k.clone();
                    let mut inputs = inputs.clone();
                    if let Kernel::Conv(c) = &mut k {
                        *c = c.clone().channels_last(x_nhwc, out_nhwc);
                        if x_nhwc {
                            inputs[0] = channels_last(&inputs[0]);
                            inputs[1] = channels_last(&inputs[1]);
                        }
                        if out_nhwc && c.residual {
                            let last = inputs.len() - 1;
                            inputs[last] = channels_last(&inputs[last]);
                        }
                        vector_loads.insert((x_nhwc, c.vector_loads()));
                    }
                    if let Kernel::Gemm(m) = &k {
                        gemm_loads.insert((m.trans_b, m.vector_loads()));
                    }
                    let want = k.run_cpu(&inputs.iter().collect::<Vec<_>>());
                    let same = if out_nhwc { channels_last(&nchw) } else { nchw.clone() };
                    let e = smelt::precision_error(&want, &same);
                    assert!(
                        e.max_abs_over_range <= 1e-2,
                        "{what} ({policy}): {} is {:.2e} of range from NCHW",
                        k.name(),
                        e.max_abs_over_range
                    );
                    let want = want.data().to_le_bytes();
                    // NCHW on every tile; the other layouts on the square
                    // tile and on 128x128 (results staged in two passes).
                    let tiles: Vec<Tile> = Tile::CANDIDATES.into_iter().filter(|t| !(x_nhwc || out_nhwc) || t.m == t.n).collect();
                    for tile in tiles {
                        let mut k = k.clone();
                        let name = format!("{}_{}x{}", k.name(), tile.m, tile.n);
                        match &mut k {
                            Kernel::Conv(c) => c.tile = tile,
                            Kernel::Gemm(m) => m.tile = tile,
                            _ => unreachable!(),
                        }
                        k.rename(name.clone());
                        let bufs: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
                        seen.insert((matches!(k, Kernel::Conv(_)), tile.m, tile.n, x_nhwc, out_nhwc));
                        cases.push((format!("{what} ({policy}): {name}"), k, bufs, want.clone()));
                    }
                }
            }
        }
    }
    // Every tile's kernel compiled at once (in batches, on all cores), then
    // each run in every schedule.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sources: Vec<KernelSource> =
        cases.iter().map(|(_, k, _, _)| KernelSource::new(k.name(), k.cuda(), Level::for_work(k.flops() as u64))).collect();
    let compiled = emu.compile_many(&sources, threads, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compiled.len(), cases.len());
    for ((what, k, mut bufs, want), compiled) in cases.into_iter().zip(&compiled) {
        bufs.push(vec![0u8; want.len()]);
        let l = k.launch();
        let dims = (l.grid.map(|d| d as u32), l.block.map(|d| d as u32));
        for schedule in Schedule::ALL {
            bufs.last_mut().unwrap().fill(0);
            let mut args: Vec<RawArg> = bufs.iter_mut().map(|b| RawArg::Buffer(b)).collect();
            launch_raw_scheduled(compiled, dims, &mut args, schedule).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(bufs.last().unwrap() == &want, "{what}: differs from its description in the schedule {schedule:?}");
        }
    }
    // Each tile's kernel also compiles with NVRTC.
    if let Some(nv) = &nv {
        let sources: Vec<(String, String)> = sources.into_iter().map(|k| (k.name, k.source)).collect();
        smelt_codegen::program::compile_all(nv, &sources, threads, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(seen.len(), 2 * Tile::CANDIDATES.len() + 3 * 2, "every tile of both kernels and every layout ran: {seen:?}");
    // Scalar and 16-byte loads of both operands in both layouts.
    for want in [(false, (false, false)), (false, (true, false)), (true, (false, false)), (true, (true, true))] {
        assert!(vector_loads.contains(&want), "no conv with (x channels-last, (vector weights, vector x)) = {want:?}: {vector_loads:?}");
    }
    // GEMMs: 16-byte loads of A alone, of a transposed B alone, and of both
    // (double-buffered by cp.async) with B transposed and not.
    for want in [(false, (true, false)), (true, (false, true)), (true, (true, true)), (false, (true, true))] {
        assert!(gemm_loads.contains(&want), "no GEMM with (B transposed, (vector A, vector B)) = {want:?}: {gemm_loads:?}");
    }
}

/// One convolution of the layout sweep: in and out channels, kernel,
/// stride, padding, dilation, groups, batch and image side.
#[derive(Clone, Copy, Debug)]
struct ConvCase {
    c: usize,
    m: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    g: usize,
    n: usize,
    hw: usize,
}

/// Every conv shape the layout and tile code tells apart: 1x1 and kxk,
/// stride 1 and 2, padding or none, dilation, groups (dense, grouped with
/// whole and partial 16-byte chunks per group, depthwise), channel counts
/// that are whole 16-byte chunks of f16 (8), of f32 only (4), or neither,
/// a 3-channel stem; batch 1 and 2.
const CONV_CASES: [ConvCase; 14] = [
    // ResNet-18's layer2.0 downsample: 1x1 stride 2 of 64 channels (issue 43).
    ConvCase { c: 64, m: 128, k: 1, s: 2, p: 0, d: 1, g: 1, n: 1, hw: 14 },
    ConvCase { c: 64, m: 64, k: 3, s: 1, p: 1, d: 1, g: 1, n: 2, hw: 9 },
    ConvCase { c: 64, m: 128, k: 3, s: 2, p: 1, d: 1, g: 1, n: 1, hw: 10 },
    ConvCase { c: 24, m: 40, k: 5, s: 2, p: 2, d: 1, g: 1, n: 1, hw: 11 },
    ConvCase { c: 20, m: 32, k: 3, s: 1, p: 2, d: 2, g: 1, n: 2, hw: 9 },
    ConvCase { c: 12, m: 16, k: 1, s: 1, p: 0, d: 1, g: 1, n: 1, hw: 7 },
    ConvCase { c: 32, m: 64, k: 3, s: 1, p: 1, d: 1, g: 2, n: 1, hw: 8 },
    ConvCase { c: 48, m: 96, k: 3, s: 2, p: 1, d: 1, g: 4, n: 2, hw: 9 },
    ConvCase { c: 16, m: 16, k: 3, s: 2, p: 1, d: 1, g: 2, n: 1, hw: 9 },
    ConvCase { c: 30, m: 30, k: 3, s: 1, p: 1, d: 1, g: 30, n: 1, hw: 8 },
    ConvCase { c: 3, m: 16, k: 7, s: 2, p: 3, d: 1, g: 1, n: 2, hw: 16 },
    ConvCase { c: 18, m: 36, k: 3, s: 1, p: 0, d: 1, g: 1, n: 1, hw: 8 },
    ConvCase { c: 40, m: 24, k: 1, s: 1, p: 0, d: 1, g: 1, n: 2, hw: 5 },
    ConvCase { c: 32, m: 24, k: 3, s: 2, p: 0, d: 2, g: 1, n: 1, hw: 12 },
];

/// A graph that puts `case` in every layout the program may give it: read
/// channels-last (after a tensor-core conv) and written channels-last (for
/// two tensor-core convs) with a channels-last residual (another conv of
/// the case); and read NCHW (the graph input) with an NCHW residual (a
/// graph input), its output read by a tensor-core conv (which is where
/// ResNet-18's layer1 went wrong: the residual read channels-last).
fn conv_case_graph(case: ConvCase, seed: u64) -> Graph {
    use smelt_ir::Conv;
    let mut b = Builder::new(seed);
    let x = b.input("x", &[case.n, case.c, case.hw, case.hw]).unwrap();
    let conv = |b: &mut Builder, x: ValueId, m: usize, k: usize, s: usize, p: usize, d: usize, g: usize| {
        let cg = b.ty(x).shape[1] / g;
        let std = (2.0 / (cg * k * k) as f32).sqrt();
        let w = b.weight(format!("w{}", b.ty(x).shape[1] * 1000 + m), &[m, cg, k, k], |r| r.normal() * std);
        let bias = b.weight(format!("b{m}"), &[m], |r| 0.1 * r.normal());
        let conv = Conv { strides: vec![s; 2], pads: vec![p; 4], dilations: vec![d; 2], group: g };
        b.op(Op::Conv(conv), &[x, w, bias]).unwrap()
    };
    let ConvCase { c, m, k, s, p, d, g, .. } = case;
    let a = conv(&mut b, x, c, 3, 1, 1, 1, 1);
    let a = b.relu(a).unwrap();
    let y = conv(&mut b, a, m, k, s, p, d, g);
    let z = conv(&mut b, a, m, k, s, p, d, g);
    let z = b.add(z, y).unwrap();
    let z = b.relu(z).unwrap();
    let o1 = conv(&mut b, z, 16, 1, 1, 0, 1, 1);
    let r = b.input("r", &b.ty(y).shape.clone()).unwrap();
    let q = conv(&mut b, x, m, k, s, p, d, g);
    let q = b.add(q, r).unwrap();
    let q = b.relu(q).unwrap();
    let o2 = conv(&mut b, q, 16, 1, 1, 0, 1, 1);
    let mut graph = b.finish("o1", o1).unwrap();
    let mut outs = graph.outputs().to_vec();
    outs.push(("o2".into(), o2));
    graph.set_outputs(outs);
    graph
}

/// Asserts every kernel agreed with its description and with the reference
/// executor running its node's op.
fn assert_kernels_match_the_reference(what: &str, checks: &[KernelCheck]) {
    use smelt_runtime::exec::Against;
    let reference = checks.iter().filter(|c| c.against == Against::Reference).count();
    assert!(reference > 0 && 2 * reference == checks.len(), "{what}: every kernel is checked against both oracles");
    let bad: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!("{} (node {}) against its {:?}: {:.3e} of range, {} elements", c.kernel, c.node, c.against, c.of_range, c.mismatches)
        })
        .collect();
    assert!(bad.is_empty(), "{what}: kernels disagree:\n{}", bad.join("\n"));
}

/// Issue 43: every conv shape of [`CONV_CASES`] in every layout, under the
/// GPU default (TF32), exact f32 and both mixed precisions, each kernel
/// checked against the reference executor running its node's op (layouts
/// converted by the oracle's own code), both as the description runs on
/// the host and as the CUDA C runs on the emulator, and each program's
/// outputs against the reference executor's.
#[test]
fn conv_shapes_match_the_reference_in_every_layout() {
    use smelt_codegen::kernel::Kernel;
    let policies = ["tf32", "f32", "mixed-f16", "mixed-bf16"];
    let mut runs = Vec::new();
    for (i, &case) in CONV_CASES.iter().enumerate() {
        for policy in policies {
            let g = conv_case_graph(case, i as u64);
            let (program, compiled) = program(&g, options(false, policy));
            runs.push((format!("{case:?} {policy}"), g, program, compiled));
        }
    }
    smelt_runtime::emu::precompile(runs.iter().map(|r| &r.2)).unwrap_or_else(|e| panic!("{e}"));
    // Which layouts and loads the sweep reached.
    let mut seen = BTreeSet::new();
    for (what, g, program, compiled) in runs {
        assert_layouts_agree(&program);
        for st in &program.steps {
            if let Kernel::Conv(c) = &st.kernel {
                seen.insert(format!("{}{}", if c.tensor_cores() { "tc" } else { "cuda cores" }, c.layout_suffix()));
                if c.residual {
                    seen.insert(format!("residual{}", if c.out_nhwc { " nhwc" } else { " nchw" }));
                }
                seen.insert(format!("vector loads {:?}", c.vector_loads()));
            }
        }
        let x = common::random_inputs(&g, 11);
        let want = smelt_runtime::cpu::run(&compiled.graph, &x).unwrap();
        let blob = program.weights_blob(&compiled.graph).unwrap();
        let host = smelt_runtime::host::HostDevice::new();
        let mut on_host = smelt_runtime::exec::Executor::new(host, program.clone(), &blob, None).unwrap();
        on_host.check_against_reference(compiled.graph.clone()).unwrap();
        let (_, checks) = on_host.run_checked(&x, 0.0).unwrap();
        assert_kernels_match_the_reference(&format!("{what}, descriptions"), &checks);
        let mut exec = smelt_runtime::emu::executor(program, &blob, &|_| {}).unwrap_or_else(|e| panic!("{e}"));
        exec.check_against_reference(compiled.graph.clone()).unwrap();
        let (outputs, checks) = exec.run_checked(&x, KERNEL_RTOL).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_kernels_match_the_reference(&format!("{what}, CUDA C"), &checks);
        // TF32 rounding is not continuous: a last-bit difference upstream
        // may round an operand the other way (2^-11 of it).
        let budget = if what.ends_with(" f32") {
            1e-5
        } else if what.ends_with("tf32") {
            2e-3
        } else {
            2e-2
        };
        for (got, want) in common::paired(&outputs, &want) {
            let r = smelt::precision_error(got, want);
            assert!(r.max_abs_over_range <= budget, "{what}: {:.2e} of range from the CPU reference executor", r.max_abs_over_range);
        }
    }
    for must in [
        "tc_nhwc",
        "tc_to_nhwc",
        "tc_to_nchw",
        "tc",
        "cuda cores",
        "residual nhwc",
        "residual nchw",
        "vector loads (true, true)",
        "vector loads (false, false)",
        "vector loads (true, false)",
    ] {
        assert!(seen.contains(must), "the sweep never reached {must}: {seen:?}");
    }
}

/// torchvision's models of `scripts/make_vision.py`.
const VISION: [&str; 8] =
    ["resnet18", "resnet34", "resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit"];

/// Issue 43: torchvision's models (as users export them, at full width on
/// 64x64 images) at batch 1 and 2 on the emulator under `policy`, every
/// kernel checked against its description and the reference executor; the
/// logits against the reference executor of the same graph (same flags:
/// TF32 operands rounded as the GPU rounds them) and against onnxruntime
/// in f32 (with the same arg-max).
fn vision_models_in(policy: &str) {
    let dir = common::testdata().join("vision");
    assert!(dir.join(".done").is_file(), "{} missing: run scripts/fetch-testdata.sh", dir.display());
    let mut runs = Vec::new();
    for name in VISION {
        for batch in [1, 2] {
            let spec = dir.join(name).join("model.onnx").display().to_string();
            let plain = common::load(&spec, Some(batch));
            let (program, compiled) = program(&plain, options(false, policy));
            runs.push((name, batch, program, compiled));
        }
    }
    smelt_runtime::emu::precompile(runs.iter().map(|r| &r.2)).unwrap_or_else(|e| panic!("{e}"));
    println!("{:<20} {:>5} {:>8} {:>12} {:>12}", "model", "batch", "kernels", "vs cpu ref", "vs ort");
    for (name, batch, program, compiled) in runs {
        let what = format!("{name} batch {batch} {policy}");
        let read = |file: String| smelt_ir::onnx::read_tensor_file(&dir.join(name).join(file)).unwrap_or_else(|e| panic!("{what}: {e}")).1;
        let (x, want) = (read(format!("input_b{batch}.pb")), read(format!("output_b{batch}.pb")));
        let blob = program.weights_blob(&compiled.graph).unwrap();
        let mut exec = smelt_runtime::emu::executor(program, &blob, &|_| {}).unwrap_or_else(|e| panic!("{what}: {e}"));
        exec.check_against_reference(compiled.graph.clone()).unwrap();
        let (outputs, checks) = exec.run_checked(std::slice::from_ref(&x), KERNEL_RTOL).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_kernels_match_the_reference(&what, &checks);
        let reference = smelt_runtime::cpu::run(&compiled.graph, std::slice::from_ref(&x)).unwrap();
        let r = smelt::precision_error(&outputs[0], &reference[0]);
        let o = smelt::precision_error(&outputs[0], &want);
        println!("{name:<20} {batch:>5} {:>8} {:>12.2e} {:>12.2e}", checks.len() / 2, r.max_abs_over_range, o.max_abs_over_range);
        // Against the reference of the same graph: sums in another order,
        // whose last bits may round a TF32 operand or a half activation the
        // other way downstream (measured: at most 6e-4 of range in TF32
        // and f16, 6e-3 in bf16). Against onnxruntime's exact f32, TF32
        // and f16 keep 10 mantissa bits, bf16 7 (measured: 1.2e-3 and 8.5e-3).
        let (near, far) = match policy {
            "tf32" => (2e-3, 5e-3),
            "mixed-f16" => (3e-3, 5e-3),
            _ => (2e-2, 3e-2),
        };
        assert!(r.max_abs_over_range <= near, "{what}: {:.2e} of range from the CPU reference executor (same flags)", r.max_abs_over_range);
        assert!(o.max_abs_over_range <= far, "{what}: {:.2e} of range from onnxruntime's f32 logits", o.max_abs_over_range);
    }
}

#[test]
fn vision_models_in_tf32_match_the_reference_and_onnxruntime() {
    vision_models_in("tf32");
}

#[test]
fn vision_models_in_mixed_f16_match_the_reference_and_onnxruntime() {
    vision_models_in("mixed-f16");
}

#[test]
fn vision_models_in_mixed_bf16_match_the_reference_and_onnxruntime() {
    vision_models_in("mixed-bf16");
}

/// NaN stays NaN (issue 44), as in IEEE 754's `maximum`, ONNX, numpy and
/// PyTorch: through ReLU, clip, max and min, max pooling, reduce-max and a
/// conv's fused ReLU, on the reference executor, the kernels' descriptions
/// and the generated CUDA C alike (`fmaxf` would drop it).
#[test]
fn nan_stays_nan_through_max_relu_clip_and_pooling() {
    let mut b = Builder::new(5);
    let x = b.input("x", &[1, 8, 4, 4]).unwrap();
    let relu = b.relu(x).unwrap();
    let clip = b.op(Op::Clip { min: -0.5, max: 0.5 }, &[x]).unwrap();
    let k = b.weight("k".into(), &[8, 1, 1], |r| r.normal());
    let max = b.op(Op::Binary(smelt_ir::BinaryOp::Max), &[x, k]).unwrap();
    let min = b.op(Op::Binary(smelt_ir::BinaryOp::Min), &[x, k]).unwrap();
    let pool = b.max_pool(x, 2, 2, 0).unwrap();
    let reduce = b.op(Op::Reduce { op: smelt_ir::ReduceOp::Max, axes: vec![2, 3], keepdims: false }, &[x]).unwrap();
    let conv = b.conv(x, 8, 1, 1, 0).unwrap();
    let conv = b.relu(conv).unwrap();
    let mut g = b.finish("relu", relu).unwrap();
    let mut outs = g.outputs().to_vec();
    for (name, v) in [("clip", clip), ("max", max), ("min", min), ("pool", pool), ("reduce", reduce), ("conv", conv)] {
        outs.push((name.into(), v));
    }
    g.set_outputs(outs);
    // Channel 0 has a NaN at (0, 0): every output reading it is NaN there;
    // channel 1 has none.
    let mut v = common::random_inputs(&g, 3)[0].to_f32_vec();
    v[0] = f32::NAN;
    let x = Tensor::from_f32(vec![1, 8, 4, 4], v);
    for policy in ["f32", "mixed-f16"] {
        let want = smelt_runtime::cpu::run(&common::session(&g, options(false, policy)).compile().unwrap().graph, std::slice::from_ref(&x))
            .unwrap();
        let e = emulate(&g, false, policy, std::slice::from_ref(&x));
        assert_kernels_agree(policy, &e);
        for (i, ((name, _), (got, want))) in g.outputs().iter().zip(e.outputs.iter().zip(&want)).enumerate() {
            let (got, want) = (got.to_f32_vec(), want.to_f32_vec());
            let nan = |v: &[f32]| v.iter().enumerate().filter(|(_, x)| x.is_nan()).map(|(i, _)| i).collect::<Vec<_>>();
            assert_eq!(nan(&got), nan(&want), "{policy} output {i} ({name}): NaN in other places than the reference's");
            // The conv mixes channels: every output element reading (0, 0) is NaN.
            let expect: Vec<usize> = match name.as_str() {
                "relu" | "clip" | "max" | "min" | "pool" | "reduce" => vec![0],
                _ => (0..8).map(|c| c * 16).collect(),
            };
            assert_eq!(nan(&want), expect, "{policy} output {name}: the reference drops or spreads a NaN");
        }
    }
}
