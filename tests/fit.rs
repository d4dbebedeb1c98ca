//! Rematerialization and `smelt fit`: every plan with recomputation passes
//! the independent checker and is monotone in its budget; recomputed nodes
//! keep their own identity; the recipe `smelt fit` predicts is the plan
//! `smelt plan --recipe` makes, byte for byte; a recipe trains to the
//! weights of the plain step (recomputation: bit for bit; accumulation: to
//! rounding); nothing fitting is an error that names the smallest footprint.
//! Built-in models only: no test data needed.

mod common;

use common::smelt;
use smelt::{Options, Remat, Session};
use smelt_ir::npy;
use smelt_passes::train::{BatchNorm, Loss, TrainConfig};
use std::path::{Path, PathBuf};

fn adam(accumulate: usize) -> TrainConfig {
    TrainConfig {
        loss: Loss::CrossEntropy { smoothing: 0.0 },
        loss_on: None,
        optimizer: Some(common::adam(accumulate, Default::default())),
        freeze: Vec::new(),
        only: Vec::new(),
        batch_norm: BatchNorm::Frozen,
        clip_norm: None,
        loss_scale: false,
    }
}

fn session(model: &str, batch: usize) -> Session {
    let options = Options { batch: Some(batch), train: Some(adam(1)), ..Options::default() };
    Session::open(model, options).unwrap()
}

/// Arena and recomputation cost (FLOPs) at each budget, planned and checked.
fn walk_budgets(model: &str, batch: usize, steps: usize) -> Vec<(usize, usize, usize)> {
    let mut s = session(model, batch);
    let plain = s.compile().unwrap();
    let arena = s.plan(&plain).unwrap().plan.arena;
    let mut out = Vec::new();
    for i in 0..=steps {
        let budget = arena - arena * i / (2 * steps); // down to half the arena
        let mut c = plain.clone();
        match s.rematerialize(&mut c, &Remat { budget, ..Default::default() }) {
            Ok(()) => {}
            Err(smelt::Error::RematBudget { smallest, .. }) => {
                assert!(smallest > budget, "{model}: unreachable {budget}, yet {smallest} was reached");
                break;
            }
            Err(e) => panic!("{model} budget {budget}: {e}"),
        }
        // Session::plan runs the independent checker on the plan.
        let planned = s.plan(&c).unwrap_or_else(|e| panic!("{model} budget {budget}: {e}"));
        assert!(planned.plan.arena <= budget, "{model}: arena {} over the budget {budget}", planned.plan.arena);
        let r = c.remat.as_ref().unwrap();
        assert_eq!(r.arena_after, planned.plan.arena, "{model}: the report's arena is the plan's");
        // Recomputations are nodes of their own, each naming an original.
        let g = &c.graph;
        let clones: Vec<_> = g.node_ids().filter(|&n| g.node(n).recomputes.is_some()).collect();
        assert_eq!(clones.len(), r.recomputed.len());
        for &n in &clones {
            let o = g.node(n).recomputes.unwrap();
            assert_ne!(n, o);
            assert_eq!(g.node(n).name, format!("{}.recompute", g.node(o).name));
            assert!(g.node(o).recomputes.is_none(), "a recomputation of a recomputation");
        }
        out.push((budget, planned.plan.arena, r.flops));
    }
    out
}

#[test]
fn recomputation_fits_its_budget_passes_the_checker_and_is_monotone() {
    for (model, batch) in [("zoo:resnet8", 8), ("zoo:resnet50", 2), ("zoo:mobilenet_v2", 2)] {
        let w = walk_budgets(model, batch, 8);
        assert!(w.len() >= 3, "{model}: recomputation reached only {} budgets: {w:?}", w.len());
        assert!(w.last().unwrap().1 < w[0].1, "{model}: recomputation never lowered the arena: {w:?}");
        for p in w.windows(2) {
            let ((b0, a0, f0), (b1, a1, f1)) = (p[0], p[1]);
            assert!(b1 <= b0);
            assert!(a1 <= a0, "{model}: budget {b1} gave a larger arena ({a1}) than {b0} ({a0})");
            assert!(f1 >= f0, "{model}: budget {b1} recomputes less ({f1} FLOPs) than {b0} ({f0})");
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("smelt-fit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_ok(args: &[&str]) -> String {
    let out = smelt().args(args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "smelt {args:?} failed:\n{stderr}\n{stdout}");
    stdout.to_string()
}

fn refused(args: &[&str]) -> String {
    let out = smelt().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "smelt {args:?} should exit 2:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// `smelt fit --json --save-recipe`: the output and the recipe.
fn fit(model: &str, batch: usize, limit: &str, dir: &Path, extra: &[&str]) -> (serde_json::Value, PathBuf) {
    let recipe = dir.join(format!("recipe-{limit}.json"));
    let b = batch.to_string();
    let mut args = vec!["fit", model, "--train", "adam", "--batch", &b, "--memory-limit", limit, "--json", "--save-recipe"];
    args.push(recipe.to_str().unwrap());
    args.extend(extra);
    (json(&run_ok(&args)), recipe)
}

#[test]
fn fit_predicts_exactly_the_plan_that_the_recipe_makes() {
    let dir = scratch("predict");
    let plain = json(&run_ok(&["plan", "zoo:resnet50", "--train", "adam", "--batch", "8", "--json"]));
    let arena = plain["plan"]["arena_bytes"].as_u64().unwrap() as usize;
    // The whole step at micro-batch 8 fits at 2 GiB; at 0.8 of its arena
    // (plus the weights) it needs recomputation or accumulation.
    let (f, _) = fit("zoo:resnet50", 8, "2GiB", &dir, &[]);
    assert_eq!(f["chosen"]["micro_batch"].as_u64(), Some(8));
    assert!(f["chosen"]["remat"].is_null());
    let persistent = f["chosen"]["persistent_bytes"].as_u64().unwrap() as usize;
    let limit = persistent + arena * 4 / 5;
    let (f, recipe) = fit("zoo:resnet50", 8, &limit.to_string(), &dir, &[]);
    let chosen = &f["chosen"];
    assert!(chosen["total_bytes"].as_u64().unwrap() as usize <= limit, "{chosen}");
    let p = json(&run_ok(&["plan", "zoo:resnet50", "--recipe", recipe.to_str().unwrap(), "--json"]));
    assert_eq!(p["plan"]["arena_bytes"], chosen["arena_bytes"], "smelt plan --recipe plans what smelt fit predicted");
    assert_eq!(p["batch"].as_u64(), Some(8));
    let r = json(&std::fs::read_to_string(&recipe).unwrap());
    assert_eq!(r["predicted"]["arena_bytes"], chosen["arena_bytes"]);
    assert_eq!(r["predicted"]["total_bytes"], chosen["total_bytes"]);
    // At this limit micro-batch 8 fits by recomputation (faster than
    // accumulating micro-batches of 4): the plan recomputes what fit chose.
    assert_eq!(chosen["micro_batch"].as_u64(), Some(8), "{chosen}");
    assert!(!chosen["remat"].is_null(), "micro-batch 8 at 0.8 of its arena recomputes: {chosen}");
    assert_eq!(p["recomputation"]["recomputed"], chosen["remat"]["recomputed"]);
    // Each candidate that was passed over says why.
    for c in f["candidates"].as_array().unwrap() {
        assert!(c["verdict"].is_string(), "{c}");
    }
    // The exact solver, at micro-batch 8 with recomputation: its recipe
    // names it, plans what fit predicted, and recomputes no dearer.
    let at8 = |f: &serde_json::Value| f["candidates"].as_array().unwrap().iter().find(|c| c["micro_batch"] == 8).cloned().unwrap();
    let greedy = at8(&f);
    let exact_dir = dir.join("exact");
    std::fs::create_dir_all(&exact_dir).unwrap();
    let (fe, recipe) = fit("zoo:resnet50", 8, &limit.to_string(), &exact_dir, &["--remat-solver", "exact"]);
    let exact = at8(&fe);
    assert_eq!(exact["verdict"], "fits", "{exact}");
    assert_eq!(exact["remat"]["solver"], "exact", "{}", exact["remat"]);
    assert!(exact["remat"]["lower_bound_seconds"].as_f64().unwrap() <= exact["remat"]["cost_seconds"].as_f64().unwrap() * (1.0 + 1e-9));
    assert!(exact["arena_bytes"].as_u64().unwrap() as usize + persistent <= limit);
    assert!(greedy["verdict"] == "fits" && !greedy["remat"].is_null(), "{greedy}");
    let (e, g) = (exact["remat"]["cost_seconds"].as_f64().unwrap(), greedy["remat"]["cost_seconds"].as_f64().unwrap());
    assert!(e <= g * (1.0 + 1e-9), "exact {e} s dearer than greedy {g} s");
    assert_eq!(fe["chosen"]["micro_batch"].as_u64(), Some(8), "{}", fe["chosen"]);
    assert_eq!(json(&std::fs::read_to_string(&recipe).unwrap())["remat_solver"], "exact");
    let p = json(&run_ok(&["plan", "zoo:resnet50", "--recipe", recipe.to_str().unwrap(), "--json"]));
    assert_eq!(p["plan"]["arena_bytes"], exact["arena_bytes"], "smelt plan --recipe plans what the exact solver chose");
    assert_eq!(p["recomputation"]["recomputed"], exact["remat"]["recomputed"]);
}

#[test]
fn a_smaller_limit_never_predicts_a_larger_peak_or_cheaper_recomputation() {
    let dir = scratch("monotone");
    let mut last: Option<(u64, u64)> = None;
    let mut fitted = 0;
    for mib in [15, 13, 12, 11, 10] {
        let (f, _) = fit("zoo:resnet8", 32, &format!("{mib}MiB"), &dir, &[]);
        // One micro-batch (32): only recomputation may bring it down.
        let at32: Vec<_> = f["candidates"].as_array().unwrap().iter().filter(|c| c["micro_batch"] == 32).collect();
        let c = at32[0];
        if c["verdict"] != "fits" {
            break;
        }
        let (arena, flops) = (c["arena_bytes"].as_u64().unwrap(), c["recompute_flops"].as_u64().unwrap());
        if let Some((a0, f0)) = last {
            assert!(arena <= a0 && flops >= f0, "{mib} MiB: arena {arena} (was {a0}), recomputed FLOPs {flops} (was {f0})");
        }
        last = Some((arena, flops));
        fitted += 1;
    }
    // The first two limits fit without recomputation, the others need it:
    // at least three pairs compared.
    assert!(fitted >= 4, "only {fitted} limits fitted");
    assert!(last.is_some_and(|(_, f)| f > 0), "no limit made recomputation necessary");
}

/// The checkpointed values of a short CPU training run.
fn trained(args: &[&str], dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut a = vec!["train", "zoo:resnet8", "--data", "synthetic:64", "--steps", "2", "--checkpoint", dir.to_str().unwrap()];
    a.extend(args);
    run_ok(&a);
    let mut v: Vec<_> = npy::read_npz(&dir.join("checkpoint.npz")).unwrap().into_iter().map(|(k, t)| (k, t.to_f32_vec())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn recipes_train_to_the_weights_of_the_plain_step() {
    let dir = scratch("weights");
    let plain = trained(&["--optimizer", "adam", "--batch", "8"], &dir.join("plain"));
    // A limit that needs recomputation at micro-batch 8; then one that
    // needs accumulation as well.
    let (f, remat) = fit("zoo:resnet8", 8, "3600KiB", &dir, &[]);
    assert_eq!(f["chosen"]["micro_batch"].as_u64(), Some(8), "{}", f["chosen"]);
    assert!(!f["chosen"]["remat"].is_null(), "3600 KiB should need recomputation: {}", f["chosen"]);
    let got = trained(&["--recipe", remat.to_str().unwrap()], &dir.join("remat"));
    assert_eq!(got, plain, "recomputation runs the same kernels on the same operands: the same weights, bit for bit");
    let (f, acc) = fit("zoo:resnet8", 8, "2200KiB", &dir, &[]);
    assert!(f["chosen"]["accumulate"].as_u64().unwrap() > 1, "2200 KiB should need accumulation: {}", f["chosen"]);
    let got = trained(&["--recipe", acc.to_str().unwrap()], &dir.join("acc"));
    // The accumulators are extra state; every value of the plain step is there.
    let got: std::collections::HashMap<_, _> = got.into_iter().collect();
    for (name, b) in plain.iter().filter(|(n, _)| n != "train.step") {
        // (the step counter counts micro-steps)
        let a = got.get(name).unwrap_or_else(|| panic!("{name} missing from the accumulating run's checkpoint"));
        assert_eq!(a.len(), b.len(), "{name}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{name}: {x} against {y} without accumulation");
        }
    }
}

#[test]
fn nothing_fitting_names_the_smallest_footprint_and_bad_requests_are_refused() {
    let dir = scratch("refused");
    let e = refused(&["fit", "zoo:resnet8", "--train", "adam", "--batch", "8", "--memory-limit", "1MiB"]);
    assert!(e.contains("no recipe of zoo:resnet8 fits in 1.0 MiB: the smallest footprint is"), "{e}");
    // A huge batch is refused at once, not walked divisor by divisor.
    let e = refused(&["fit", "zoo:resnet8", "--train", "adam", "--batch", "100000000000", "--memory-limit", "1GiB"]);
    assert!(e.contains("too large"), "{e}");
    assert_eq!(smelt::fit::divisors(12), [12, 6, 4, 3, 2, 1]);
    assert_eq!(smelt::fit::divisors(49), [49, 7, 1]);
    let e = refused(&["fit", "zoo:resnet8", "--batch", "8", "--memory-limit", "1GiB"]);
    assert!(e.contains("--train"), "{e}");
    let e = refused(&["fit", "zoo:resnet8", "--train", "adam", "--accumulate", "2", "--batch", "8", "--memory-limit", "1GiB"]);
    assert!(e.contains("chooses the accumulation"), "{e}");
    let (_, recipe) = fit("zoo:resnet8", 8, "1GiB", &dir, &[]);
    let e = refused(&["plan", "zoo:resnet50", "--recipe", recipe.to_str().unwrap()]);
    assert!(e.contains("made for zoo:resnet8"), "{e}");
    let e = refused(&["plan", "zoo:resnet8", "--recipe", recipe.to_str().unwrap(), "--train", "sgd"]);
    assert!(e.contains("made for --train adam"), "{e}");
    std::fs::write(dir.join("bad.json"), "{\"smelt_recipe\": 1}").unwrap();
    let e = refused(&["plan", "zoo:resnet8", "--recipe", dir.join("bad.json").to_str().unwrap()]);
    assert!(e.contains("not a smelt recipe"), "{e}");
    // A budget recomputation cannot reach is the user's problem, said plainly.
    let e = refused(&["plan", "zoo:resnet8", "--train", "adam", "--batch", "8", "--remat-budget", "1KiB"]);
    assert!(e.contains("cannot bring the arena under"), "{e}");
}

#[test]
fn the_greedy_recomputation_is_measured_against_the_exhaustive_optimum() {
    // Every subset of ResNet-8's saved values, cheapest first, planned as
    // the greedy walk plans: the optimum of the same model.
    let mut s = session("zoo:resnet8", 8);
    let g = s.compile().unwrap().graph;
    let target = smelt_codegen::Target::default();
    let cost = |g: &smelt_ir::KernelGraph, n| smelt::cost::node_time(g, n, &target);
    let arena = smelt_passes::memory::plan(&g).unwrap().arena;
    let mut rows = Vec::new();
    for i in 1..=9 {
        let budget = arena - arena * i / 40;
        let exact = smelt_passes::remat::exhaustive(&g, budget, None, &cost, 14).unwrap();
        let greedy = smelt_passes::remat::choose(&g, budget, None, &cost).unwrap().ok();
        match (exact, &greedy) {
            (Some((best, at)), Some(o)) => {
                assert!(best <= o.cost * (1.0 + 1e-9), "budget {budget}: the exhaustive search found {best}, above the greedy {}", o.cost);
                assert!(at <= budget && o.plan.arena <= budget);
                rows.push(format!(
                    "budget {budget}: greedy {:.3} us, optimum {:.3} us ({:.2}x)",
                    o.cost * 1e6,
                    best * 1e6,
                    o.cost / best.max(1e-12)
                ));
            }
            (None, Some(o)) => panic!("budget {budget}: the greedy fits ({}) where the exhaustive search finds nothing", o.plan.arena),
            (Some((best, _)), None) => rows.push(format!("budget {budget}: greedy cannot, optimum {:.3} us", best * 1e6)),
            (None, None) => rows.push(format!("budget {budget}: neither fits")),
        }
    }
    eprintln!("zoo:resnet8 batch 8, arena {arena}:\n  {}", rows.join("\n  "));
    assert!(rows.iter().any(|r| r.contains("optimum")), "no budget was reachable: {rows:?}");
}

#[test]
fn a_transformer_keeps_its_micro_batch_by_recomputing_attention() {
    // BERT-base without a loss flag: its output is not logits, so the loss
    // is the mean squared error (said in a note). At its weights and state
    // plus 3/4 of its arena, accumulation would add accumulators as large
    // as the parameters: recomputation is the way.
    let dir = scratch("bert");
    let args = ["--dim", "sequence=128"];
    let (f, _) = fit("zoo:bert_base", 8, "100GiB", &dir, &args);
    let (arena, persistent) = (f["chosen"]["arena_bytes"].as_u64().unwrap(), f["chosen"]["persistent_bytes"].as_u64().unwrap());
    let limit = (persistent + arena * 3 / 4).to_string();
    let (f, recipe) = fit("zoo:bert_base", 8, &limit, &dir, &args);
    let c = &f["chosen"];
    assert_eq!((c["micro_batch"].as_u64(), c["accumulate"].as_u64()), (Some(8), Some(1)), "{c}");
    let names: Vec<&str> = c["remat"]["recomputed"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    // The cheap, wide values go first: the feed-forward GELUs (4x the hidden width).
    assert!(names.iter().any(|n| n.starts_with("gelu")), "{names:?}");
    let (re, fwd) = (c["recompute_flops"].as_f64().unwrap(), c["forward_flops"].as_f64().unwrap());
    assert!(re > 0.0 && re < fwd / 3.0, "recomputation {re} FLOPs against a forward pass of {fwd}");
    let p = json(&run_ok(&["plan", "zoo:bert_base", "--recipe", recipe.to_str().unwrap(), "--json"]));
    assert_eq!(p["plan"]["arena_bytes"], c["arena_bytes"]);
}

#[test]
fn data_parallel_recipes_are_planned_per_gpu_and_labelled_as_plans() {
    let dir = scratch("dp");
    let mut last = usize::MAX;
    for shard in ["none", "optimizer", "gradients", "parameters"] {
        let (f, recipe) = fit("zoo:resnet8", 32, "1GiB", &dir, &["--gpus", "4", "--shard", shard]);
        let c = &f["chosen"];
        assert_eq!(c["micro_batch"].as_u64(), Some(8), "each GPU takes 32 / 4 samples: {c}");
        let dp = &c["data_parallel"];
        let (one, each) = (dp["unsharded_persistent_bytes"].as_u64().unwrap() as usize, c["persistent_bytes"].as_u64().unwrap() as usize);
        let ops: Vec<&str> = dp["collectives"].as_array().unwrap().iter().map(|x| x["op"].as_str().unwrap()).collect();
        match shard {
            "none" => assert_eq!((ops, each), (vec!["all-reduce"], one)),
            "parameters" => assert!(ops.contains(&"all-gather") && ops.contains(&"reduce-scatter") && each < one, "{ops:?} {each}"),
            _ => assert!(ops.contains(&"reduce-scatter") && each < one && each <= last, "{shard}: {ops:?} {each} of {one}"),
        }
        assert!(dp["communication_seconds"].as_f64().unwrap() > 0.0);
        last = each;
        let e = refused(&["plan", "zoo:resnet8", "--recipe", recipe.to_str().unwrap()]);
        assert!(e.contains("plans data parallelism over 4 GPUs"), "{e}");
    }
    let e = refused(&["fit", "zoo:resnet8", "--train", "adam", "--batch", "32", "--memory-limit", "1GiB", "--gpus", "3"]);
    assert!(e.contains("does not split evenly"), "{e}");
}

/// The table of the closing note (run by hand: `cargo test --release
/// --test fit remat_solvers_table -- --ignored --nocapture`; SMELT_MODELS
/// picks the models): each light model's training step (batch 32, Adam)
/// at half its arena, the greedy walk against the exact solver: priced in
/// FLOPs, as shares of the forward pass's FLOPs, with the exact solver's
/// proven lower bound; priced by the roofline (H100), in ms.
#[test]
#[ignore]
fn remat_solvers_table() {
    let models: Vec<String> = std::env::var("SMELT_MODELS").map(|m| m.split(',').map(String::from).collect()).unwrap_or_else(|_| {
        common::LIGHT.iter().map(|m| common::light_model(m).display().to_string()).chain(["zoo:resnet50".into()]).collect()
    });
    let flops = |g: &smelt_ir::KernelGraph, n| smelt::cost::node_flops(g, n) as f64;
    let target = smelt_codegen::Target::default();
    let time = |g: &smelt_ir::KernelGraph, n| smelt::cost::node_time(g, n, &target) * 1e3;
    let limit = std::time::Duration::from_secs(60);
    eprintln!("| model | saved | greedy FLOPs | exact FLOPs | lower bound | proven | greedy s | exact s | greedy ms | exact ms | proven |");
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for m in &models {
        let g = session(m, 32).compile().unwrap().graph;
        let fwd: f64 = smelt_passes::remat::forward(&g).iter().map(|&n| flops(&g, n)).sum();
        let budget = smelt_passes::memory::plan(&g).unwrap().arena / 2;
        let t = std::time::Instant::now();
        let greedy = smelt_passes::remat::choose(&g, budget, None, &flops).unwrap().ok().map(|o| o.cost / fwd);
        let tg = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let e = smelt_passes::remat::exact(&g, budget, None, &flops, limit).unwrap();
        let te = t.elapsed().as_secs_f64();
        let greedy_ms = smelt_passes::remat::choose(&g, budget, None, &time).unwrap().ok().map(|o| o.cost);
        let e_ms = smelt_passes::remat::exact(&g, budget, None, &time, limit).unwrap();
        let f = |v: Option<f64>| v.map_or("does not fit".to_string(), |v| format!("{v:.3}"));
        eprintln!(
            "| {} | {} | {} | {} | {:.3} | {} | {tg:.1} | {te:.1} | {} | {} | {} |",
            m.rsplit('/').next().unwrap_or(m).trim_end_matches(".onnx"),
            smelt_passes::remat::saved(&g).len(),
            f(greedy),
            f(e.outcome.as_ref().map(|o| o.cost / fwd)),
            e.lower_bound / fwd,
            e.proven,
            f(greedy_ms),
            f(e_ms.outcome.as_ref().map(|o| o.cost)),
            e_ms.proven,
        );
    }
}

/// The exact solver (a mixed-integer program) on ResNet-50's training step
/// at half its arena, priced in FLOPs: its choice fits once planned, its
/// cost is its recomputed kernels' and within 1.05x of its proven lower
/// bound, it is no dearer than the greedy walk's, and it recomputes under
/// a third of the forward pass's FLOPs (the target).
#[test]
fn the_exact_solver_meets_its_bound_and_beats_the_greedy_walk() {
    let g = session("zoo:resnet50", 8).compile().unwrap().graph;
    let flops = |g: &smelt_ir::KernelGraph, n| smelt::cost::node_flops(g, n) as f64;
    let fwd: f64 = smelt_passes::remat::forward(&g).iter().map(|&n| flops(&g, n)).sum();
    let budget = smelt_passes::memory::plan(&g).unwrap().arena / 2;
    let e = smelt_passes::remat::exact(&g, budget, None, &flops, std::time::Duration::from_secs(60)).unwrap();
    let o = e.outcome.as_ref().expect("the exact solver's choice fits");
    assert!(o.plan.arena <= budget, "{} over {budget}", o.plan.arena);
    smelt_passes::memory::check::check(&o.graph, &o.plan).unwrap_or_else(|e| panic!("the checker refuses the plan: {e}"));
    let clones: f64 = o.graph.node_ids().filter(|&n| o.graph.node(n).recomputes.is_some()).map(|n| flops(&o.graph, n)).sum();
    assert!((clones - o.cost).abs() <= 1e-6 * o.cost.max(1.0), "cost {} but the recomputed kernels cost {clones}", o.cost);
    assert!(
        e.lower_bound <= o.cost * (1.0 + 1e-9) && o.cost <= 1.05 * e.lower_bound,
        "cost {} against the bound {}",
        o.cost,
        e.lower_bound
    );
    let greedy = smelt_passes::remat::choose(&g, budget, None, &flops).unwrap().expect("the greedy walk fits");
    assert!(o.cost <= greedy.cost * (1.0 + 1e-9), "exact {} dearer than greedy {}", o.cost, greedy.cost);
    assert!(o.cost < fwd / 3.0, "{:.3} of the forward pass", o.cost / fwd);
    eprintln!(
        "resnet50 batch 8 at half its arena: exact {:.3} of the forward FLOPs (bound {:.3}, proven {}), greedy {:.3}",
        o.cost / fwd,
        e.lower_bound / fwd,
        e.proven,
        greedy.cost / fwd
    );
}
