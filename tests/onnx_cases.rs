//! The ONNX backend's operator cases (`pytorch-converted`, `pytorch-operator`,
//! `simple`), run from the allow-list `tests/onnx-cases.txt`: every case of
//! the wheel is listed, as `run` or as `skip` with its reason.

mod common;

use smelt_ir::onnx::{import_file, read_tensor_file, ImportOptions};
use std::collections::BTreeMap;
use std::path::Path;

const SUITES: [&str; 3] = ["pytorch-converted", "pytorch-operator", "simple"];

fn allow_list() -> BTreeMap<String, Option<String>> {
    let text = include_str!("onnx-cases.txt");
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (case, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        let entry = match rest.split_once(char::is_whitespace).unwrap_or((rest, "")) {
            ("run", _) => None,
            ("skip", reason) if !reason.trim().is_empty() => Some(reason.trim().to_string()),
            _ => panic!("onnx-cases.txt line {}: expected `<suite>/<case> run` or `<suite>/<case> skip <reason>`", i + 1),
        };
        assert!(m.insert(case.to_string(), entry).is_none(), "onnx-cases.txt lists {case} twice");
    }
    m
}

/// Runs one case; `Err` says why it failed.
fn run_case(dir: &Path) -> Result<usize, String> {
    let g = import_file(&dir.join("model.onnx"), &ImportOptions::default()).map_err(|e| format!("import: {e}"))?;
    let mut sets: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    sets.sort();
    for set in &sets {
        let read = |prefix: &str| {
            let mut files: Vec<_> = std::fs::read_dir(set)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
                .collect();
            files.sort_by_key(|p| p.file_stem().unwrap().to_string_lossy().rsplit('_').next().unwrap().parse::<usize>().unwrap());
            files.iter().map(|f| read_tensor_file(f).map(|t| t.1).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()
        };
        let (inputs, expected) = (read("input_")?, read("output_")?);
        // Imported as is, and fused (whose memory plan must pass the checker).
        let fused = smelt::Session::from_graph("case", g.clone(), Default::default())
            .and_then(|mut s| s.compile())
            .map_err(|e| format!("fuse: {e}"))?
            .graph;
        let plan = smelt_passes::memory::plan(&fused).map_err(|e| format!("plan: {e}"))?;
        smelt_passes::memory::check::check(&fused, &plan).map_err(|e| format!("plan check: {e}"))?;
        let runs = [("imported", smelt_runtime::cpu::run(&g, &inputs)), ("fused", smelt_runtime::cpu::run(&fused, &inputs))];
        for (what, outs) in runs {
            let outs = outs.map_err(|e| format!("run {what}: {e}"))?;
            if outs.len() != expected.len() {
                return Err(format!("{} outputs, expected {}", outs.len(), expected.len()));
            }
            for (i, (a, e)) in outs.iter().zip(&expected).enumerate() {
                let c = smelt::compare(a, e, 1e-3, 1e-5);
                if !c.ok {
                    return Err(format!("{what} output {i}: {c:?}"));
                }
            }
        }
    }
    Ok(sets.len())
}

#[test]
fn onnx_operator_cases() {
    let list = allow_list();
    let data = common::onnx_data();
    let mut all = Vec::new();
    for suite in SUITES {
        for e in std::fs::read_dir(data.join(suite)).unwrap() {
            all.push(format!("{suite}/{}", e.unwrap().file_name().to_string_lossy()));
        }
    }
    all.sort();
    // Print a fresh list for maintainers: SMELT_CASES_REPORT=1 cargo test onnx_operator_cases -- --nocapture
    let report = std::env::var_os("SMELT_CASES_REPORT").is_some();
    let (mut ran, mut skipped, mut failures) = (0, 0, Vec::new());
    for case in &all {
        match (list.get(case), report) {
            (_, true) => match run_case(&data.join(case)) {
                Ok(_) => println!("{case} run"),
                Err(e) => println!("{case} skip {}", e.lines().next().unwrap_or("")),
            },
            (None, false) => failures.push(format!("{case}: not in tests/onnx-cases.txt")),
            (Some(Some(_)), false) => skipped += 1,
            (Some(None), false) => match run_case(&data.join(case)) {
                Ok(_) => ran += 1,
                Err(e) => failures.push(format!("{case}: {e}")),
            },
        }
    }
    for case in list.keys() {
        if !all.contains(case) {
            failures.push(format!("{case}: listed but not in the onnx wheel"));
        }
    }
    println!("ONNX operator cases: {ran} run and matched, {skipped} skipped with a reason, {} in the wheel", all.len());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(report || ran > 0, "no case ran");
}
