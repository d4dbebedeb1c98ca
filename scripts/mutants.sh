#!/usr/bin/env bash
# Mutations the tests must catch: each one breaks the behaviour a test
# guards (in smelt's code, a document or CI's environment), runs that test,
# and passes only if the test fails, naming what broke; the file is
# restored afterwards. Tests that used to pass vacuously (issue 48) are
# checked this way. Slow (each mutation rebuilds what it touched): run by
# hand after scripts/test.sh has built everything, not by CI.
#
#   scripts/mutants.sh            every mutation
#   scripts/mutants.sh NAME...    some of them (names: scripts/mutants.sh --list)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SMELT_CUDA_INCLUDE="$site/nvidia/cuda_runtime/include"
export SMELT_PTXAS="$site/nvidia/cuda_nvcc/bin/ptxas"
export SMELT_REQUIRE_NVRTC=1 INSTA_UPDATE=no INSTA_FORCE_PASS=0

saved=()
restore() {
    for f in "${saved[@]}"; do
        cp "target/mutants/$(basename "$f")" "$f"
    done
    saved=()
}
trap restore EXIT

# sub FILE OLD NEW: replaces every occurrence of OLD (there must be one).
sub() {
    mkdir -p target/mutants
    [[ " ${saved[*]} " == *" $1 "* ]] || { cp "$1" "target/mutants/$(basename "$1")"; saved+=("$1"); }
    python3 - "$@" <<'EOF'
import sys
path, old, new = sys.argv[1:]
s = open(path).read()
if old not in s:
    sys.exit(f"mutants.sh: {path} no longer has {old!r}: update the mutation")
open(path, "w").write(s.replace(old, new))
EOF
}

# caught WHAT PATTERN CMD...: CMD must fail with PATTERN in its output.
caught() {
    local what=$1 pattern=$2 log=target/mutants/$1.log
    shift 2
    if "$@" >"$log" 2>&1; then
        echo "SURVIVED $what: $* passed" >&2
        restore
        return 1
    elif ! grep -q -- "$pattern" "$log"; then
        echo "FAILED OTHERWISE $what: no \"$pattern\" in $log" >&2
        restore
        return 1
    fi
    echo "caught   $what: $(grep -m1 -o -- ".\{0,60\}$pattern.\{0,80\}" "$log")"
    restore
}

nt() { cargo nextest run --no-fail-fast "$@"; }

# Mixed-f16 training steps that move the weights 30% less than they should
# (the learning rate times 0.7, in the kernel and its description): each
# weight stays within 2% of range of PyTorch's after 3 steps, which is all
# the old test asked.
m_mixed_f16_steps() {
    sub crates/ir/src/op.rs '(*lr as f64 * schedule.factor(step)) as f32' '(*lr as f64 * 0.7 * schedule.factor(step)) as f32'
    sub crates/codegen/src/update.rs 'return format!("    float lr = {};\n", crate::c_f32(lr));' 'return format!("    float lr = {};\n", crate::c_f32(lr * 0.7));'
    caught mixed_f16_steps "in 3 mixed-f16 steps" nt --test training -E 'test(=mixed_precision_training_steps_compile_and_run)'
}

# README and guide examples no longer seen by doctest (another prompt):
# doctest tried 0 and failed 0.
m_pytest_prompts() {
    sub README.md '>>> ' 'py> '
    sub docs/guide.md '>>> ' 'py> '
    caught pytest_prompts "examples ran of" env SMELT_BIN="$PWD/target/debug/smelt" .venv/bin/python -m pytest -q -p no:cacheprovider \
        python/tests/test_smelt.py -k test_readme_and_module_examples_run
}

# A compiled graph that loses every output but its first (at the end of
# the pass pipeline): a zip of the outputs would compare one pair.
m_paired_outputs() {
    sub crates/passes/src/pipeline.rs '    graph.set_tf32(opts.precision.tf32);
    Ok((graph, stats))' \
        '    graph.set_tf32(opts.precision.tf32);
    if graph.outputs().len() > 1 { let o = graph.outputs()[..1].to_vec(); graph.set_outputs(o); }
    Ok((graph, stats))'
    caught paired_outputs "lists of different lengths compared" nt --test regressions --test fusion --test filetests
}

# The checker without its order check: the swapped schedule is rejected for
# another reason or not at all (the old test accepted either of two plans).
m_memory_order() {
    sub crates/passes/src/memory/check.rs 'return Err(format!("{id} runs before its operand {}", name(v)));' '{}'
    caught memory_order "panicked at tests/memory.rs" nt --test memory -E 'test(=checker_rejects_corrupted_plans)'
}

# fit never recomputes: the chosen candidate's recomputation was checked
# only inside `if !chosen["remat"].is_null()`.
m_fit_remat() {
    sub src/fit.rs '        _ => {' '        _ if true => Ok((c, None)),
        _ => {'
    caught fit_remat "panicked at tests/fit.rs" nt --test fit -E 'test(=fit_predicts_exactly_the_plan_that_the_recipe_makes)'
}

# CI without ptxas: the occupancy was checked only `if SMELT_PTXAS` was set.
m_cli_ptxas() {
    caught cli_ptxas "SMELT_PTXAS is not" env -u SMELT_PTXAS cargo nextest run --test cli -E 'test(=compile_report_puts_every_launch_on_the_roofline)'
}

# Fused ReLUs that flush values below 1e-3 to zero, in the kernel
# descriptions and the CUDA C alike: the reference executor of the fused
# graph agrees, the logits move by far less than 1e-3 of their range, and
# only an element-wise tolerance against onnxruntime sees it.
m_excess() {
    sub crates/ir/src/fused.rs 'Act::Relu => crate::op::max_nan(x, 0.0),' 'Act::Relu => if x < 1e-3 { 0.0 } else { x },'
    sub crates/codegen/src/gemm.rs 'Act::Relu => crate::c_max(x, "0.0f"),' 'Act::Relu => format!("({x} < 1e-3f ? 0.0f : {x})"),'
    caught excess "times the tolerance" nt --test emulator -E 'test(=light_variants_fused_match_onnxruntime_logits)'
}

# Tensor-core GEMMs without the barrier before the next step's loads: only
# an order of a block's threads other than lockstep sees the race; GPT-2
# runs in all three on the emulator.
m_schedules() {
    sub crates/codegen/src/gemm.rs '            // Before the next step'"'"'s loads overwrite the tiles.
            s += "        __syncthreads();\n    }\n";' '            s += "    }\n";'
    caught schedules "mixed-f16 WarpsInOrder: kernels disagree" nt --test transformers -E 'test(=generated_cuda_matches_onnxruntime_on_the_emulator)'
}

# Resuming from a checkpoint with arrays missing (the old code left them at
# their initial values).
m_checkpoint() {
    sub src/train/mod.rs '    if !written.is_empty() {' '    if false {'
    caught checkpoint "should be refused with exit 2" nt --test train_cmd -E 'test(=resuming_gives_the_weights_of_an_uninterrupted_run)'
}

# A snapshot that no longer matches, with a caller that asks insta to accept
# it: scripts/test.sh's settings fail the test anyway.
m_insta_update() {
    sub tests/snapshots/codegen__kind_gemm_tc.snap '__syncthreads' '__syncwarp'
    caught insta_update "snapshot assertion" env INSTA_UPDATE=always INSTA_FORCE_PASS=1 \
        bash -c 'export INSTA_UPDATE=no INSTA_FORCE_PASS=0; cargo nextest run --test codegen -E "test(=attention_gemm_norm_select_grad_and_update_snapshots)"'
    rm -f tests/snapshots/*.snap.new
}

# The guide's Rust example calling a function smelt does not have.
m_guide_doctest() {
    sub docs/guide.md 'smelt::Session::open(' 'smelt::load('
    caught guide_doctest "cannot find function .load. in crate .smelt." cargo test --doc -p smelt
}

# Per-token cross-entropy that counts the ignored labels (-100): the loss
# is no longer PyTorch's.
m_ignore_index() {
    sub crates/passes/src/train/mod.rs 'Tensor::from_i64(vec![], vec![IGNORE_INDEX])' 'Tensor::from_i64(vec![], vec![IGNORE_INDEX + 1])'
    caught ignore_index "lm/sgd" nt --test training -E 'test(=three_steps_give_pytorchs_weights)'
}

# A folded additive mask taken for a bias again.
m_additive_mask() {
    sub crates/passes/src/train/mod.rs 't.ty().dtype.is_float() && t.to_f32_vec().iter().any(|&x| x <= -1e30)' 'false && t.ty().dtype.is_float()'
    caught additive_mask "a_folded_additive_mask_is_not_trained_as_a_bias" nt --test training -E 'test(=a_folded_additive_mask_is_not_trained_as_a_bias)'
}

# Tied weights not found (the LM head's transposed copy trains apart from
# the embedding, or not at all).
m_ties() {
    sub crates/passes/src/train/mod.rs '            out.insert(copy, s);' '            let _ = (copy, s);'
    caught ties "qwen2_tied_dynamo" nt --test training -E 'test(=hugging_face_models_train_as_pytorch_trains_them)'
}

# Parameters told by their names no more: embeddings, RMSNorm scales,
# class tokens and layer scales stay frozen, as before issue 42.
m_named_parameters() {
    sub crates/passes/src/train/mod.rs 'if node.op == Op::Constant && named(&node.name) == Named::Parameter && candidate(g, n) {' 'if false {'
    caught named_parameters "smelt trains the initializers holding PyTorch" nt --test training -E 'test(=hugging_face_models_train_as_pytorch_trains_them)'
}

# A batch norm's running statistics that the exporter merged with its
# scale and bias move with them (or freeze them).
m_merged_statistics() {
    sub crates/passes/src/train/mod.rs '.filter(|n| !other_reads.contains(n)).collect();' '.collect();'
    caught merged_statistics "bn_fresh" nt --test training -E 'test(=three_steps_give_pytorchs_weights)'
}

# The strided slice's gradient lands one position off.
m_strided_slice() {
    sub crates/passes/src/train/vjp.rs '                pads[r + 1 + a + 1] = s - 1;' '                pads[a + 1] = 1;
                pads[r + 1 + a + 1] = s - 2;'
    caught strided_slice "slice" nt --test training -E 'test(=every_gradient_rule_matches_finite_differences)'
}

# --batch leaving an exporter's Expand at the exported batch: Llama at
# batch 1 would come out at batch 2 (refused now, not rewritten).
m_batch_expand() {
    sub crates/ir/src/onnx/shape_ops.rs '                    target[0] = new;' '                    target[0] = exported;'
    caught batch_expand "left == right" nt --test train_cmd -E 'test(=a_batch_baked_into_the_graph_is_rewritten_or_refused)'
}

# The rewritten graph's rows checked against the exported one's: rows fed
# in another order must show (as a wrong rewrite would).
m_batch_rows() {
    sub tests/train_cmd.rs '.map(|t| pick(t, batch, 0))' '.map(|t| pick(t, batch, 1))'
    caught batch_rows "rows differ from the exported batch" nt --test train_cmd -E 'test(=a_batch_baked_into_the_graph_is_rewritten_or_refused)'
}

# --trainable no longer resolving PyTorch's names of the weights the
# TorchScript exporter folded (onnx::MatMul_530) through their nodes' names.
m_aliases() {
    sub crates/passes/src/train/mod.rs '.filter(|m| m.len() == 1)?;' '.filter(|m| m.len() == 99)?;'
    caught aliases "llama_torchscript_folded" nt --test training -E 'test(=hugging_face_models_train_as_pytorch_trains_them)'
}

# Issue 43's bug put back: a conv writes channels-last whatever layout its
# residual is held in. Its description agrees with its CUDA C; the layout
# check sees it, and without that check, the oracle (the reference executor
# running the node) does.
m_residual_layout() {
    sub crates/codegen/src/program.rs '.filter(|&id| !keep(id) || !residual_fits(id))' '.filter(|&id| !keep(id) || (!residual_fits(id) && false))'
    caught residual_layout "in the wrong layout" nt --test emulator -E 'test(=conv_shapes_match_the_reference_in_every_layout)'
}
m_residual_layout_oracle() {
    sub crates/codegen/src/program.rs '.filter(|&id| !keep(id) || !residual_fits(id))' '.filter(|&id| !keep(id) || (!residual_fits(id) && false))'
    sub tests/emulator.rs '        assert_layouts_agree(&program);
        for st in &program.steps {' '        for st in &program.steps {'
    caught residual_layout_oracle "against its Reference" nt --test emulator -E 'test(=conv_shapes_match_the_reference_in_every_layout)'
}

# ReLU as fmaxf and f32::max again: a NaN becomes 0 (issue 44).
m_relu_nan() {
    sub crates/ir/src/op.rs 'UnaryOp::Relu => max_nan(x, 0.0),' 'UnaryOp::Relu => x.max(0.0),'
    sub crates/codegen/src/elementwise.rs 'UnaryOp::Relu => crate::c_max(x, "0.0f"),' 'UnaryOp::Relu => format!("fmaxf({x}, 0.0f)"),'
    caught relu_nan "drops or spreads a NaN" nt --test emulator -E 'test(=nan_stays_nan_through_max_relu_clip_and_pooling)'
}

# A checkpoint's step counter no longer checked against its steps: the
# fuzzer's corpus file (a counter of 1e30) overflows the update (issue 44).
m_step_counter() {
    sub src/train/mod.rs 'if name == "train.step" {' 'if name == "train.step" && false {'
    caught step_counter "attempt to add with overflow" nt --test fuzz -E 'test(=mutated_training_files_never_fail)'
}

# Flags that would be ignored accepted again: --momentum with Adam, and two
# arrays for the labels (issue 44).
m_ignored_flags() {
    sub src/args.rs 'if let (Some(m), true) = (self.momentum, opt != "sgd") {' 'if let (Some(m), true) = (self.momentum, opt == "none") {'
    caught ignored_flags "should be refused with exit 2" nt --test train_cmd -E 'test(=flags_that_would_be_ignored_are_refused_and_a_divergence_keeps_the_last_checkpoint)'
}
m_two_label_arrays() {
    sub src/train/mod.rs 'if found.len() > 1 {' 'if found.len() > 2 {'
    caught two_label_arrays "should be refused with exit 2" nt --test train_cmd -E 'test(=flags_that_would_be_ignored_are_refused_and_a_divergence_keeps_the_last_checkpoint)'
}

all=(mixed_f16_steps pytest_prompts paired_outputs memory_order fit_remat cli_ptxas excess schedules checkpoint insta_update guide_doctest ignore_index additive_mask ties named_parameters merged_statistics strided_slice batch_expand batch_rows aliases residual_layout residual_layout_oracle relu_nan step_counter ignored_flags two_label_arrays)
if [[ ${1:-} == --list ]]; then
    printf '%s\n' "${all[@]}"
    exit 0
fi
status=0
for m in "${@:-${all[@]}}"; do
    "m_$m" || status=1
done
exit $status
