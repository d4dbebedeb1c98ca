//! Filetests: text IR in, the IR after a pass out, compared with an insta
//! snapshot (`INSTA_UPDATE=always cargo test --test filetests` accepts a
//! change). `tests/filetests/<pass>/*.tir`; the folder names the pass. Each
//! case also runs on the CPU before and after: the numbers must agree, and
//! every node a pass made lowers to a kernel.

mod common;

use smelt_ir::text;
use smelt_ir::OpSet;
use std::collections::BTreeSet;
use std::path::Path;

/// Runs the `fuse` filetest `path`; returns the snapshot text and the rules that fired.
fn check_fuse(path: &Path) -> (String, BTreeSet<String>) {
    let src = std::fs::read_to_string(path).unwrap();
    let mut before = text::parse(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    smelt::fill_missing_weights(&mut before);
    let smelt::Compiled { graph: after, stats, .. } = common::session(&before, Default::default()).compile().unwrap();
    let inputs = common::random_inputs(&before, 1);
    let want = smelt_runtime::cpu::run(&before, &inputs).unwrap();
    let got = smelt_runtime::cpu::run(&after, &inputs).unwrap();
    for (a, b) in common::paired(&got, &want) {
        let c = smelt::compare(a, b, 1e-4, 1e-5);
        assert!(c.ok, "{}: fused numbers differ: {c:?}", path.display());
    }
    // Every rule's output has a kernel: a node that does not lower must be
    // an op that was already in the input and has none (a pass never makes one).
    let plan = smelt_passes::memory::plan(&after).unwrap();
    for id in after.node_ids() {
        if let Err(e) = smelt_codegen::Kernel::lower(&after, id, plan.copied_concats.contains(&id)) {
            let op = &after.node(id).op;
            let had = before.node_ids().any(|n| before.node(n).op.name() == op.name());
            assert!(
                had && matches!(smelt_codegen::Route::of(&after, id), smelt_codegen::Route::Refused(_)),
                "{}: a pass produced {} which has no kernel: {e}",
                path.display(),
                op.name()
            );
        }
    }
    let fusion = stats.fusion.unwrap();
    let hits: BTreeSet<String> = fusion.rule_hits.iter().filter(|(_, &n)| n > 0).map(|(r, _)| r.clone()).collect();
    let kernels = after.node_ids().filter(|&n| after.node(n).op.is_kernel()).count();
    let header =
        format!("; rules: {}\n; kernels: {} -> {kernels}\n", hits.iter().cloned().collect::<Vec<_>>().join(", "), fusion.kernels_before);
    (header + &text::print(&after), hits)
}

#[test]
fn fuse_filetests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests/fuse");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "tir")).collect();
    files.sort();
    let mut fired = BTreeSet::new();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir.join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    for f in &files {
        let (out, hits) = check_fuse(f);
        fired.extend(hits);
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        settings.bind(|| insta::assert_snapshot!(name, out));
    }
    // Every rule has a filetest in which it fires.
    let all: BTreeSet<String> = smelt_passes::fusion::rules::rules().iter().map(|r| r.name.to_string()).collect();
    let missing: Vec<_> = all.difference(&fired).collect();
    assert!(missing.is_empty(), "rules without a filetest: {missing:?}");
}
