//! The `smelt` command line: reports, JSON, exit codes and error messages.

mod common;

use common::smelt;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = smelt().args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn no_arguments_runs_the_default_model() {
    let (code, out, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("zoo:resnet50")
            && out.contains("176 ops before")
            && out.contains("57 kernels after")
            && out.contains("ran on the CPU"),
        "{out}"
    );
}

#[test]
fn inspect_json_reports_the_model() {
    let m = common::light_model("resnet50");
    let (code, out, err) = run(&["inspect", m.to_str().unwrap(), "--json", "--batch", "8"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["op_histogram"]["conv"], 53);
    assert_eq!(v["op_histogram"]["batch_norm"], 53);
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!([8, 3, 224, 224]));
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([8, 1000]));
    // ResNet-50 has 25.6 M parameters (BN statistics included: 25.6 M + 2 x 26.5 k).
    let params = v["parameter_bytes"].as_u64().unwrap();
    assert!((102_000_000..103_000_000).contains(&params), "{params}");
    assert!(v["naive_activation_bytes"].as_u64().unwrap() > (800 << 20));
}

#[test]
fn run_json_and_mismatch_exit_code() {
    let v = common::variant("squeezenet");
    let (input, expect) = (v.join("input_0.pb"), v.join("output_0.pb"));
    let model = v.join("model.onnx");
    let (code, out, _) = run(&[
        "run",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--expect",
        expect.to_str().unwrap(),
        "--atol",
        "1e-4",
        "--json",
    ]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["ok"], true);
    assert_eq!(j["outputs"][0]["comparison"]["mismatches"], 0);
    // The dummy input is not the variant's input: the outputs must not match.
    let (code, out, _) = run(&["run", model.to_str().unwrap(), "--expect", expect.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISMATCH"), "{out}");
}

#[test]
fn save_outputs_writes_tensor_files() {
    let dir = std::env::temp_dir().join(format!("smelt-cli-{}", std::process::id()));
    let (code, _, err) = run(&["run", "zoo:mobilenet_v2", "--save-outputs", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (name, t) = smelt_ir::onnx::read_tensor_file(&dir.join("output_0.pb")).unwrap();
    assert_eq!((name.as_str(), t.shape()), ("prob", &[1, 1000][..]));
    let sum: f32 = t.to_f32_vec().iter().sum();
    assert!((sum - 1.0).abs() < 1e-4, "softmax sums to {sum}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn print_then_run_a_text_file() {
    let dir = std::env::temp_dir().join(format!("smelt-tir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tir = dir.join("m.tir");
    let (code, _, err) = run(&["print", "zoo:mobilenet_v2", "-o", tir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["run", tir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("filled with deterministic random values") && out.contains("output prob: f32[1,1000]"), "{err}{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn errors_are_clear_and_exit_2() {
    let (code, _, err) = run(&["inspect", "/nonexistent/model.onnx"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/model.onnx") && err.contains("No such file"), "{err}");
    let (code, _, err) = run(&["inspect", "zoo:alexnet"]);
    assert_eq!(code, 2);
    assert!(err.contains("no built-in model \"alexnet\""), "{err}");
    let (code, _, err) = run(&["run", "zoo:resnet50", "--batch", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--batch must be at least 1"), "{err}");
}

#[test]
fn compile_dumps_the_ir_after_a_pass() {
    let m = common::light_model("resnet50");
    let (code, out, err) = run(&["compile", m.to_str().unwrap(), "--dump-ir", "fuse"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("graph {") && out.contains("fused_conv(") && out.contains("residual=true, act=\"relu\""), "{out}");
    let (_, before, _) = run(&["compile", m.to_str().unwrap(), "--dump-ir", "dce"]);
    assert!(before.contains("batch_norm(") && !before.contains("fused_conv"));
    let (code, _, err) = run(&["compile", m.to_str().unwrap(), "--dump-ir", "nonsense"]);
    assert_eq!(code, 2);
    let passes =
        "possible values: dce, fuse, layer-norm, views, precision, ew-cluster, reduce-fuse, attention, gemm-epilogue, concat, final-dce";
    assert!(err.contains(passes), "{err}");
    let (code, json, _) = run(&["compile", m.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["fusion"]["stop_reason"], "Saturated");
    assert_eq!(v["fusion"]["rule_hits"]["fold-bn-into-conv"], 53);
}

#[test]
fn inspect_shows_kernels_before_and_after_fusion() {
    let m = common::light_model("resnet50");
    let (_, out, _) = run(&["inspect", m.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ops"], 176);
    assert_eq!(v["kernels"], 57);
    assert_eq!(v["kernel_histogram"]["fused_conv"], 49);
    let (_, out, _) = run(&["inspect", m.to_str().unwrap(), "--json", "--no-fuse"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kernels"], 175, "without fusion every op but the reshape view is a kernel");
}

#[test]
fn plan_reports_and_checks() {
    let m = common::light_model("resnet50");
    let svg = std::env::temp_dir().join(format!("smelt-plan-{}.svg", std::process::id()));
    let (code, out, err) = run(&["plan", m.to_str().unwrap(), "--batch", "8", "--json", "--svg", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (p, u) = (&v["plan"], &v["without_fusion"]);
    assert_eq!(p["checked"], true);
    assert!(p["arena_bytes"].as_u64().unwrap() < u["arena_bytes"].as_u64().unwrap());
    assert!(p["arena_over_lower_bound"].as_f64().unwrap() <= 1.02);
    assert!(p["lower_bound_bytes"].as_u64().unwrap() <= p["arena_bytes"].as_u64().unwrap());
    assert_eq!(p["peak_live"][0]["ty"], "f32[8,256,56,56]");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("with fusion: peak") && picture.contains("<rect"));
    std::fs::remove_file(svg).unwrap();
}

#[test]
fn memory_limit_failure_names_the_peak_and_the_knobs() {
    let m = common::light_model("resnet50");
    // 20 MiB fits once the peak's layers are split; 6 MiB does not (the
    // whole batch of images alone is 4.6 MiB), a smaller batch does.
    let (code, out, err) = run(&["plan", m.to_str().unwrap(), "--batch", "8", "--memory-limit", "20MiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("split execution (--memory-limit 20.0 MiB)"), "{out}");
    let (code, _, err) = run(&["plan", m.to_str().unwrap(), "--batch", "8", "--memory-limit", "6MiB"]);
    assert_eq!(code, 2);
    assert!(err.contains("memory limit is 6.0 MiB") && err.contains("peak:") && err.contains("f32[8,3,224,224]"), "{err}");
    assert!(err.contains("a smaller batch: --batch ") && err.contains("mixed precision"), "{err}");
    let (code, _, _) = run(&["plan", m.to_str().unwrap(), "--memory-limit", "1GB"]);
    assert_eq!(code, 0);
    let (code, _, err) = run(&["plan", m.to_str().unwrap(), "--memory-limit", "6 parsecs"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown unit"), "{err}");
}

/// `smelt compile --out`: kernels, PTX, plan.json with every argument inside
/// the arena or the weights blob, the memory report; a second compile comes
/// entirely from the cache. NVRTC is needed (required where the test script
/// set SMELT_REQUIRE_NVRTC; skipped with a reason elsewhere).
#[test]
fn compile_out_writes_kernels_ptx_and_plan() {
    if !common::nvrtc_or_skip("`smelt compile --out`") {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("smelt-compile-out-{}", std::process::id()));
    let (out_dir, cache) = (tmp.join("out"), tmp.join("cache"));
    let m = common::variant("squeezenet").join("model.onnx");
    let args = ["compile", m.to_str().unwrap(), "--batch", "2", "--out", out_dir.to_str().unwrap(), "--weights", "--json"];
    let compile = || {
        let out = smelt().args(args).env("SMELT_CACHE_DIR", &cache).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = compile();
    let distinct = first["distinct_kernels"].as_u64().unwrap();
    assert!(distinct >= 10 && first["from_cache"] == 0, "{first}");
    let second = compile();
    assert_eq!(second["from_cache"].as_u64().unwrap(), distinct, "the second compile must come from the cache: {second}");

    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("plan.json")).unwrap()).unwrap();
    let (arena, weights) = (plan["arena_bytes"].as_u64().unwrap(), plan["weights_bytes"].as_u64().unwrap());
    assert_eq!(std::fs::metadata(out_dir.join("weights.bin")).unwrap().len(), weights);
    let steps = plan["steps"].as_array().unwrap();
    assert_eq!(steps.len() as u64, first["kernels"].as_u64().unwrap());
    for s in steps {
        let name = s["kernel"].as_str().unwrap();
        let cu = std::fs::read_to_string(out_dir.join(s["source"].as_str().unwrap())).unwrap();
        assert!(cu.contains(&format!("void {name}(")), "{name}");
        let ptx = std::fs::read_to_string(out_dir.join(s["ptx"].as_str().unwrap())).unwrap();
        assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
        assert!(s["grid"].as_array().unwrap().iter().all(|d| d.as_u64().unwrap() >= 1));
        let args = s["args"].as_array().unwrap();
        assert_eq!(args.last().unwrap()["space"], "arena", "{name} writes into the arena");
        for a in args {
            let limit = if a["space"] == "arena" { arena } else { weights };
            assert!(a["offset"].as_u64().unwrap() + a["bytes"].as_u64().unwrap() <= limit, "{name}: {a} beyond {limit}");
        }
    }
    let mem: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("memory.json")).unwrap()).unwrap();
    assert_eq!(mem["plan"]["arena_bytes"].as_u64().unwrap(), arena);
    assert!(std::fs::read_to_string(out_dir.join("memory.svg")).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(tmp).unwrap();
}

/// An op with no CUDA kernel is refused when code is generated, naming the
/// kernel-graph node and, through provenance, the model nodes it computes;
/// a kernel-level op in a model file is refused with what it is.
#[test]
fn missing_kernels_name_the_model_nodes() {
    let dir = std::env::temp_dir().join(format!("smelt-nokernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tir = dir.join("split.tir");
    let src = "graph {\n  %0 \"x\" = input : f32[2,8]\n  %1 \"r\" = relu(%0) : f32[2,8]\n  %2 \"encoder.split\" = split(%1) {axis=1, sizes=[3,5]} : f32[2,3], f32[2,5]\n  output \"y\" = %2\n  output \"z\" = %2:1\n}\n";
    std::fs::write(&tir, src).unwrap();
    let (code, _, err) = run(&["compile", tir.to_str().unwrap(), "--out", dir.join("out").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("node encoder.split (split): no CUDA kernel yet"), "{err}");
    assert!(err.contains("it computes the model's node \"encoder.split\" (split)"), "{err}");
    // The CPU reference executor runs it.
    let (code, _, err) = run(&["run", tir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(&tir, src.replace("relu(%0)", "elementwise(%0) {expr=\"relu($0)\"}")).unwrap();
    let (code, _, err) = run(&["inspect", tir.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("elementwise is a kernel-level op"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--backend emulator` runs the generated CUDA C; `--check-kernels`
/// reports every kernel against its description and the reference
/// executor, in the JSON too; a TF32 mismatch with --expect says how to
/// compare exactly; the device-only flags are refused on the CPU backend.
#[test]
fn run_on_the_emulator_checks_kernels() {
    let v = common::variant("squeezenet");
    let (input, expect) = (v.join("input_0.pb"), v.join("output_0.pb"));
    let model = v.join("model.onnx");
    // Exact f32 (TF32 convolutions, the GPU default, are further from onnxruntime than --expect's tolerance).
    let args = ["run", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--expect", expect.to_str().unwrap(), "--tf32", "off"];
    let (code, out, err) = run(&[&args[..], &["--backend", "emulator", "--check-kernels", "--json"]].concat());
    assert_eq!(code, 0, "{out}{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["backend"], "emulator");
    let checks = j["kernel_checks"].as_array().unwrap();
    assert!(checks.len() > 40 && checks.iter().all(|c| c["ok"] == true), "{checks:?}");
    // Every kernel against its description and against the reference executor.
    let against = |what: &str| checks.iter().filter(|c| c["against"] == what).count();
    assert!(against("description") == against("reference") && 2 * against("reference") == checks.len(), "{checks:?}");
    assert_eq!(j["outputs"][0]["comparison"]["ok"], true);
    // Under TF32 (the default) the logits leave --expect's tolerance: the
    // run says why and how to compare exactly.
    let (code, out, err) = run(&args[..args.len() - 2].iter().chain(&["--backend", "emulator"]).copied().collect::<Vec<_>>());
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("expected: MISMATCH") && out.contains("ran in TF32") && out.contains("run with --tf32 off"), "{out}");
    let (code, out, _) = run(&[&args[..], &["--backend", "emulator", "--profile"]].concat());
    assert_eq!(code, 0);
    assert!(out.contains("ran on the emulator") && out.contains("kernels,") && out.contains("expected: OK"), "{out}");
    let (code, _, err) = run(&[&args[..], &["--check-kernels"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("apply to --backend cuda or emulator"), "{err}");
}

#[test]
fn plan_train_reports_where_the_bytes_go() {
    let m = common::testdata().join("training").join("cnn").join("model.onnx");
    let m = m.to_str().unwrap();
    let svg = std::env::temp_dir().join(format!("smelt-train-{}.svg", std::process::id()));
    let (code, out, err) = run(&["plan", m, "--train", "adam", "--json", "--svg", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("is a softmax: cross-entropy is computed on its input"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["training"];
    // 5 layers: 4 weights and biases, a batch norm's scale and bias; Adam keeps two moments of each.
    assert_eq!(t["parameters"]["count"], 10);
    assert_eq!(t["optimizer_state"]["bytes"].as_u64().unwrap(), 2 * t["parameters"]["bytes"].as_u64().unwrap());
    assert_eq!(t["arena_bytes"], v["plan"]["arena_bytes"]);
    assert!(t["saved_activations"]["bytes"].as_u64().unwrap() > 0 && t["peak_phase"] == "backward", "{t}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("forward | backward"));
    let _ = std::fs::remove_file(&svg);
    // Text: the breakdown.
    let (code, out, err) = run(&["plan", m, "--train", "sgd", "--momentum", "0", "--batch", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("training step (sgd, 10 parameters trained)") && out.contains("saved activations"), "{out}");
    assert!(out.contains("optimizer state                0 B"), "plain SGD keeps no state: {out}");
    // The user's mistakes: exit 2, named.
    for (args, want) in [
        (vec!["--train", "sgd", "--loss-on", "nope"], "the model has no output \"nope\" (its outputs: y)"),
        (vec!["--train", "sgd", "--freeze", "*"], "nothing to train"),
        (vec!["--train", "adam", "--nesterov"], "--nesterov needs --train sgd"),
        (vec!["--train", "sgd", "--label-smoothing", "1.5"], "label smoothing 1.5 must be in [0, 1)"),
        (vec!["--loss", "mse"], "--train"),
    ] {
        let mut a = vec!["plan", m];
        a.extend(args.iter());
        let (code, _, err) = run(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn set_gives_a_graph_input_that_an_op_needs_at_compile_time() {
    let d = common::testdata().join("onnx-node/test_reshape_negative_dim");
    let (model, set) = (d.join("model.onnx"), d.join("test_data_set_0"));
    let (model, x, y) = (model.to_str().unwrap(), set.join("input_0.pb"), set.join("output_0.pb"));
    // Without the value: refused, naming the input and the flag.
    let (code, _, err) = run(&["run", model]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("graph input \"shape\"") && err.contains("--set shape=VALUES"), "{err}");
    // With it, the input leaves the program's inputs and the run matches.
    let args = ["run", model, "--set", "shape=2,-1,2", "--input", x.to_str().unwrap(), "--expect", y.to_str().unwrap()];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("expected: OK"), "{out}");
    // A wrong count, an unknown name, a fraction for an integer input.
    for (set, want) in [("shape=2,-1", "3 values), 2 given"), ("shap=1", "no graph input named shap"), ("shape=2,-1.5,2", "not an integer")]
    {
        let (code, _, err) = run(&["run", model, "--set", set]);
        assert_eq!(code, 2, "{set}: {err}");
        assert!(err.contains(want), "{set}: {err}");
    }
}

/// `smelt compile --report`: every launch on the roofline, ResNet-50's
/// convolutions all on tensor cores under mixed-f16, in TF32 under f32
/// (the default `--tf32 conv`) and none with `--tf32 off`, no
/// launch faster than its roofs allow, the parts summing to the whole, and
/// occupancy from ptxas's registers and shared memory.
#[test]
fn compile_report_puts_every_launch_on_the_roofline() {
    if !common::nvrtc_or_skip("`smelt compile --report`") {
        return;
    }
    let report = |precision: &str, device: &str| {
        let (precision, tf32) = precision.split_once(' ').unwrap_or((precision, "conv"));
        let out = smelt()
            .args(["compile", "zoo:resnet50", "--batch", "32", "--precision", precision, "--tf32", tf32, "--report", "--device", device])
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["report"].clone()
    };
    // Registers and occupancy come from ptxas, which CI always has.
    let ptxas = std::env::var_os("SMELT_PTXAS").is_some();
    assert!(ptxas || std::env::var_os("SMELT_REQUIRE_NVRTC").is_none(), "SMELT_REQUIRE_NVRTC is set but SMELT_PTXAS is not");
    let mut occupancy_checked = 0;
    // f32 convolutions run in TF32 by default, on CUDA cores with --tf32 off.
    for (precision, on_tc) in [("mixed-f16", true), ("mixed-bf16", true), ("f32", true), ("f32 off", false)] {
        let r = report(precision, "h100");
        let conv = &r["by_kind"]["conv"];
        assert_eq!(conv["launches"], 53, "{precision}: {conv}");
        assert_eq!(conv["on_tensor_cores"].as_u64().unwrap(), if on_tc { 53 } else { 0 }, "{precision}: {conv}");
        let tf32 = r["launches"].as_array().unwrap().iter().filter(|l| l["tf32"] == true).count();
        assert_eq!(tf32, if precision == "f32" { 53 } else { 0 }, "{precision}: launches in TF32");
        let (bw, tc, fp32) = (
            r["device"]["bandwidth"].as_f64().unwrap(),
            r["device"]["tensor_flops"].as_f64().unwrap(),
            r["device"]["flops"].as_f64().unwrap(),
        );
        let launches = r["launches"].as_array().unwrap();
        let mut total = 0.0;
        for l in launches {
            let (s, flops, bytes) = (l["seconds"].as_f64().unwrap(), l["flops"].as_f64().unwrap(), l["bytes"].as_f64().unwrap());
            let roof = if l["tensor_cores"].as_bool().unwrap() { tc } else { fp32 };
            assert!(s >= flops / roof && s >= bytes / bw, "{precision}: faster than the roofs: {l}");
            assert!(l["of_roof"].as_f64().unwrap() <= 1.0 + 1e-9, "{l}");
            let occ = l["occupancy"].as_f64().unwrap();
            assert!(occ > 0.0 && occ <= 1.0, "{l}");
            assert!(l["registers"].as_u64().is_some_and(|r| r > 0) || !ptxas, "{l}");
            total += s;
        }
        assert!((total - r["seconds"].as_f64().unwrap()).abs() <= 1e-9 * total, "{precision}: launches do not sum to the whole");
        if on_tc && ptxas {
            occupancy_checked += 1;
            // 128 threads of a tensor-core conv at 72 registers: 7 blocks
            // of the 16 the threads allow (65536 / (4 warps x 2304)).
            let big = launches.iter().find(|l| l["kernel"].as_str().unwrap().starts_with("conv1x1_bias_relu_n32c1024h14w14_m256")).unwrap();
            let regs = big["registers"].as_u64().unwrap() as usize;
            let blocks = (65536 / (4 * (regs * 32).div_ceil(256) * 256)).min(16);
            assert!((big["occupancy"].as_f64().unwrap() - (blocks * 128) as f64 / 2048.0).abs() < 1e-9, "{big}");
        }
    }
    assert!(occupancy_checked == 3 || !ptxas, "occupancy checked in {occupancy_checked} precisions");
    // The same program is slower on an A100 and its convs nearer the roof
    // (a lower tensor rate against a similar bandwidth).
    let (h, a) = (report("mixed-f16", "h100"), report("mixed-f16", "a100"));
    assert!(a["seconds"].as_f64() > h["seconds"].as_f64());
    assert!(a["conv_of_tensor_roof"].as_f64() > h["conv_of_tensor_roof"].as_f64());
    // Text: the table, a line per kind and the summary.
    let svg = std::env::temp_dir().join(format!("smelt-roofline-{}.svg", std::process::id()));
    let (code, text, err) =
        run(&["compile", "zoo:resnet50", "--batch", "32", "--precision", "mixed-f16", "--report", "--svg", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("conv3x3_bias_relu_n32c64h56w56_m64_f16") && text.contains("\nconv ") && text.contains("of the tensor-core roof"),
        "{text}"
    );
    // The picture: a dot per launch (with its kernel named) and the roofs.
    let pic = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    let launches = h["launches"].as_array().unwrap();
    assert!(pic.starts_with("<svg") && pic.trim_end().ends_with("</svg>"));
    assert_eq!(pic.matches("<title>").count(), launches.len(), "one dot per launch");
    assert_eq!(pic.matches("<polyline").count(), 3, "memory roof meeting three compute roofs");
    assert!(launches.iter().all(|l| pic.contains(&format!("<title>{} (", l["kernel"].as_str().unwrap()))));
}

/// `--tf32` defaults to TF32 convolutions where the target has them:
/// compute_80 gets `wmma::precision::tf32` kernels, compute_70 exact f32
/// ones unless asked, and asked there it is refused naming the fix.
#[test]
fn tf32_follows_the_target() {
    if !common::nvrtc_or_skip("`smelt compile --arch`") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("smelt-tf32-{}", std::process::id()));
    let tf32_kernels = |arch: &str, extra: &[&str]| {
        let out = dir.join(arch);
        let (code, _, err) = run(&[&["compile", "zoo:resnet8", "--arch", arch, "--out", out.to_str().unwrap()], extra].concat());
        let n = std::fs::read_dir(out.join("kernels"))
            .map(|d| d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).filter(|s| s.contains("wmma::precision::tf32")).count())
            .unwrap_or(0);
        std::fs::remove_dir_all(&out).ok();
        (code, n, err)
    };
    let (code, n, err) = tf32_kernels("compute_80", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(n > 0, "compute_80: no TF32 kernel written");
    let (code, n, err) = tf32_kernels("compute_70", &[]);
    assert_eq!((code, n), (0, 0), "{err}");
    let (code, _, err) = tf32_kernels("compute_70", &["--tf32", "conv"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("has no TF32 tensor cores") && err.contains("--tf32 off"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `smelt tune` on the emulator (whose times are the CPU's: this tests the
/// tuner, not a GPU's tiles): ResNet-8's tensor-core convs each timed on
/// every candidate tile (each candidate's program checked against the
/// descriptions first), the fastest kept per kernel and written as a table
/// that `--tuning` applies: each kernel it names takes its tile, the
/// others the model's. Bad tables and a missing GPU are the user's errors.
#[test]
fn tune_times_every_tile_and_compile_applies_the_table() {
    if !common::nvrtc_or_skip("`smelt compile --report`") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("smelt-tune-{}", std::process::id()));
    let table = dir.join("tuning.json");
    let model = ["zoo:resnet8", "--precision", "mixed-f16"];
    let (code, out, err) =
        run(&[&["tune"], &model[..], &["--backend", "emulator", "--runs", "1", "--json", "--out", table.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let kernels = v["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 9, "ResNet-8's convs: {out}");
    let names = ["64x64", "128x64", "64x128", "128x128"];
    let (mut tuned_ms, mut model_ms) = (0.0, 0.0);
    for k in kernels {
        let ms: Vec<f64> = names.iter().map(|n| k["ms"][n].as_f64().unwrap_or_else(|| panic!("no time on {n}: {k}"))).collect();
        let best = ms.iter().cloned().fold(f64::INFINITY, f64::min);
        let tuned = k["tuned"].as_str().unwrap();
        assert_eq!(k["ms"][tuned].as_f64(), Some(best), "the fastest is kept: {k}");
        tuned_ms += best;
        model_ms += k["ms"][k["model"].as_str().unwrap()].as_f64().unwrap();
    }
    assert!((v["tuned_ms"].as_f64().unwrap() - tuned_ms).abs() < 1e-9, "{out}");
    assert!((v["model_ms"].as_f64().unwrap() - model_ms).abs() < 1e-9 && model_ms >= tuned_ms, "{out}");
    // The model's choices are what compile reports without a table.
    let report = |extra: &[&str]| {
        let (code, out, err) = run(&[&["compile"], &model[..], &["--report", "--json"], extra].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["report"]["launches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["tile"].is_string())
            .map(|l| l["tile"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let mut model_tiles: Vec<String> = kernels.iter().map(|k| k["model"].as_str().unwrap().to_string()).collect();
    let mut plain = report(&[]);
    model_tiles.sort();
    plain.sort();
    assert_eq!(plain, model_tiles);
    // The table written is the one measured; compile applies it.
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    let mut want: Vec<String> = kernels.iter().map(|k| k["tuned"].as_str().unwrap().to_string()).collect();
    for k in kernels {
        assert_eq!(written["tiles"][k["kernel"].as_str().unwrap()], k["tuned"], "{written}");
    }
    let mut got = report(&["--tuning", table.to_str().unwrap()]);
    want.sort();
    got.sort();
    assert_eq!(got, want);
    // A hand-made table: every kernel but one on 128x128, that one keeps the model's tile.
    let mut forced = written.clone();
    let keys: Vec<String> = forced["tiles"].as_object().unwrap().keys().cloned().collect();
    for k in &keys {
        forced["tiles"][k] = "128x128".into();
    }
    forced["tiles"].as_object_mut().unwrap().remove(&keys[0]);
    std::fs::write(&table, forced.to_string()).unwrap();
    let got = report(&["--tuning", table.to_str().unwrap()]);
    let model_of_first = &kernels.iter().find(|k| k["kernel"] == keys[0].as_str()).unwrap()["model"];
    assert_eq!(got.iter().filter(|t| *t != "128x128").count(), usize::from(model_of_first != "128x128"), "{got:?}");
    // Bad tables name what is wrong.
    forced["tiles"][&keys[1]] = "96x64".into();
    std::fs::write(&table, forced.to_string()).unwrap();
    let (code, _, err) = run(&[&["compile"], &model[..], &["--tuning", table.to_str().unwrap()]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("kernel {}: tile \"96x64\" is not one of 64x64, 128x64, 64x128, 128x128", keys[1])), "{err}");
    std::fs::write(&table, "{\"tiles\": 3}").unwrap();
    let (code, _, err) = run(&[&["plan"], &model[..], &["--tuning", table.to_str().unwrap()]].concat());
    assert!(code == 2 && err.contains("not a tuning table written by `smelt tune`"), "{err}");
    // Nothing to tune in exact f32; no GPU here for --backend cuda.
    let (code, _, err) = run(&["tune", "zoo:resnet8", "--tf32", "off", "--backend", "emulator"]);
    assert!(code == 2 && err.contains("no conv or GEMM of it runs on tensor cores"), "{err}");
    if smelt_runtime::cuda::unavailable().is_some() {
        let (code, _, err) = run(&["tune", "zoo:resnet8", "--precision", "mixed-f16"]);
        assert!(code == 2 && err.contains("needs an NVIDIA GPU"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Under mixed-f16, an activation above f16's largest value (65504) is
/// named with the kernel that made it and the ways out; under mixed-bf16
/// the same model runs clean. On the emulator the check is always on.
#[test]
fn an_f16_overflow_names_its_kernel_and_the_ways_out() {
    let dir = std::env::temp_dir().join(format!("smelt-overflow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tir = dir.join("big.tir");
    let w = vec!["30000"; 64].join(",");
    let v = vec!["0.001"; 64].join(",");
    let src = format!(
        "graph {{\n  %0 \"x\" = input : f32[2,8]\n  %1 \"w\" = const : f32[8,8] = [{w}]\n  %2 \"big\" = matmul(%0, %1) : f32[2,8]\n  %3 \"r\" = relu(%2) : f32[2,8]\n  %4 \"v\" = const : f32[8,8] = [{v}]\n  %5 \"mid\" = matmul(%3, %4) : f32[2,8]\n  %6 \"r2\" = relu(%5) : f32[2,8]\n  %7 \"head\" = matmul(%6, %4) : f32[2,8]\n  output \"y\" = %7\n}}\n"
    );
    std::fs::write(&tir, src).unwrap();
    let m = tir.to_str().unwrap();
    // The second row of x @ w is above 65504: stored in f16 for the next matmul, it is inf.
    let (code, out, err) = run(&["run", m, "--backend", "emulator", "--precision", "mixed-f16", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("warning: kernel") && err.contains("(node big)") && err.contains("65504"), "{err}");
    assert!(err.contains("--precision mixed-bf16") && err.contains("--keep-f32 'big'"), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["non_finite"]["node"], "big", "{j}");
    assert!(j["non_finite"]["inf"].as_u64().unwrap() > 0, "{j}");
    let (code, out, err) = run(&["run", m, "--backend", "emulator", "--precision", "mixed-bf16", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("warning: kernel"), "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["non_finite"].is_null(), "{j}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The command line is the binary's: the library and the Python bindings
/// take typed options (`smelt::spec`), never clap's types or an argument
/// list, so a library caller states what it wants in types the compiler
/// checks.
#[test]
fn the_library_and_python_take_typed_options_not_a_command_line() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("python/src/lib.rs")];
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            // The binary: main.rs, its flags (cli.rs) and its commands (cmd/).
            let binary = p.ends_with("src/main.rs") || p.ends_with("src/cli.rs") || p.ends_with("src/cmd");
            match () {
                _ if binary => {}
                _ if p.is_dir() => dirs.push(p),
                _ if p.extension().is_some_and(|x| x == "rs") => files.push(p),
                _ => {}
            }
        }
    }
    assert!(files.len() > 10, "the library's files are found: {files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for word in ["clap", "argv", "parse_from", "ArgMatches"] {
            assert!(
                !text.contains(word),
                "{} mentions {word}: the command line belongs to src/main.rs, src/cli.rs and src/cmd/",
                f.display()
            );
        }
    }
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(!lib.contains("mod cli") && !lib.contains("mod cmd"), "the library does not include the binary's modules");
}

/// The Llama-shaped zoo models are shapes only: planned at Hugging Face's
/// parameter counts (Llama-3-8B: 8,030,261,248 trained parameters in 291
/// tensors, grouped-query attention and an untied head included) without
/// allocating their weights; run and train refuse them, saying so.
#[test]
fn llama_zoo_models_plan_as_shapes_only() {
    let (code, out, err) = run(&["plan", "zoo:llama3_8b", "--dim", "sequence=64", "--train", "adamw", "--loss", "causal-lm", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = &v["training"]["parameters"];
    assert_eq!((p["bytes"].as_u64(), p["count"].as_u64()), (Some(8_030_261_248 * 4), Some(291)), "{p}");
    assert_eq!(v["plan"]["checked"], true, "the plan passes the checker");
    let (code, out, err) = run(&["inspect", "zoo:llama2_7b", "--dim", "sequence=32", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([1, 32, 32000]), "{v}");
    for args in [
        &["run", "zoo:llama2_7b", "--dim", "sequence=8"][..],
        &["train", "zoo:llama3_8b", "--dim", "sequence=8", "--train", "sgd", "--data", "synthetic:8"],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("shapes only"), "{args:?}: {err}");
    }
}
