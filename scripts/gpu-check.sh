#!/usr/bin/env bash
# The GPU check: the nine light models and their random-weight variants on
# CUDA against the CPU reference (and onnxruntime), then latency and peak
# device memory against PyTorch on ResNet-50 at batch 1 and 32 (eager and
# torch.compile), `smelt tune`'s measured tiles on ResNet-50 (batch 32,
# mixed-f16: each kernel on every candidate, then end to end against the
# model's tiles), then training (`smelt train --backend cuda`: small models'
# weights after 20 steps against PyTorch's, ResNet-50's step time and
# memory against PyTorch's), printed as Markdown tables. Needs an NVIDIA GPU with PyTorch,
# onnx and onnxruntime; no Rust toolchain and no network.
#
#   scripts/gpu-check.sh --prepare   on a development machine (Rust, the
#                                    test data): builds the release binary
#                                    and fills a kernel cache with the PTX of
#                                    every kernel the check needs, both into
#                                    .gpu-check/ (carry it to the GPU machine)
#   scripts/gpu-check.sh [--quick] [--budget S]
#                                    on the GPU machine, from the checkout
#                                    (--quick: f32 only, ResNet-50 at batch
#                                    32 only, no GPU tests, no training:
#                                    about 3 minutes; --budget: no part of
#                                    the check starts after S seconds, and
#                                    the slowest, torch.compile, come last)
#   scripts/gpu-check.sh --train-only  only the training check (with the
#                                    training step's per-kernel profile)
#   scripts/gpu-check.sh --vision-only only torchvision's models (ResNet-18/34,
#                                    ResNeXt, RegNet, MobileNetV3, EfficientNet,
#                                    ConvNeXt, ViT) in TF32, mixed-f16 and
#                                    mixed-bf16, every kernel against the CPU
#                                    reference executor (issue 43)
#
# Exits non-zero on any mismatch or error.
#
# Kernels come from the carried cache; a kernel missing there is compiled
# with NVRTC 12 if the machine's Python packages have it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W=.gpu-check
MODELS="bvlc_alexnet densenet121 inception_v1 inception_v2 resnet50 shufflenet squeezenet vgg19 zfnet512"

if [[ ${1:-} == --prepare ]]; then
    cargo build --release
    scripts/fetch-testdata.sh
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export SMELT_CUDA_INCLUDE="$site/nvidia/cuda_runtime/include"
    rm -rf "$W" && mkdir -p "$W"
    cp target/release/smelt "$W/smelt" && strip "$W/smelt" 2>/dev/null || true
    # The GPU tests (tests/gpu.rs) as a binary too.
    gpu_tests=$(cargo test --release --test gpu --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])' | tail -1)
    cp "$gpu_tests" "$W/gpu-tests" && strip "$W/gpu-tests" 2>/dev/null || true
    export SMELT_CACHE_DIR=$W/cache
    # Every kernel the check runs, from the check's own list.
    .venv/bin/python scripts/gpu_check.py --list-compiles --smelt - --data .testdata/onnx-data --variants .testdata/variants |
    while read -r model precision batch; do
        target/release/smelt compile "$model" --precision "$precision" --batch "$batch" --out "$W/out" --json >/dev/null
        # f32 runs with TF32 convolutions (the default) and exact (the correctness table).
        if [[ $precision == f32 ]]; then
            target/release/smelt compile "$model" --precision f32 --tf32 off --batch "$batch" --out "$W/out" --json >/dev/null
        fi
    done
    # The training check: scripts/make_train_runs.py's models, data and
    # PyTorch references, and the kernels of every training step it runs.
    cp -r .testdata/train_runs "$W/train_runs"
    .venv/bin/python scripts/gpu_check.py --list-train-compiles --smelt - --data - --variants - --train-runs "$W/train_runs" |
    while read -r -a args; do
        target/release/smelt compile "${args[@]}" --out "$W/out" --json >/dev/null
    done
    # The vision check's kernels (its models are exported on the GPU
    # machine by scripts/make_vision.py: 380 MB, too much to carry).
    .venv/bin/python scripts/gpu_check.py --list-vision-compiles --smelt - --data - --variants - --vision .testdata/vision |
    while read -r -a args; do
        target/release/smelt compile "${args[@]}" --out "$W/out" --json >/dev/null
    done
    rm -rf "$W/out"
    echo "gpu-check: prepared $W ($(du -sh "$W" | cut -f1)): carry it with the checkout" >&2
    exit 0
fi

quick=0 budget=
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) quick=1 ;;
        --train-only) quick=2 ;;
        --vision-only) quick=3 ;;
        --budget) budget=${2:?--budget needs seconds}; shift ;;
        *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ -x $W/smelt ]] || { echo "gpu-check: no $W/smelt; run scripts/gpu-check.sh --prepare on a machine with Rust and carry $W" >&2; exit 2; }
export SMELT_CACHE_DIR=$W/cache
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ -d $site/nvidia/cuda_nvrtc/lib ]] && ls "$site"/nvidia/cuda_nvrtc/lib/libnvrtc.so.12* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[[ -d $site/nvidia/cuda_runtime/include ]] && export SMELT_CUDA_INCLUDE="$site/nvidia/cuda_runtime/include"
# No NVRTC 12 but the CUDA 13 wheels (PyTorch's): their libnvrtc.so.13 under
# nvidia/cu13/lib, linked as libnvrtc.so (a name smelt's loader tries), with
# their headers (NVRTC has no built-in cuda_fp16.h). Only kernels missing
# from the carried cache need it.
if [[ -z ${SMELT_CUDA_INCLUDE:-} ]] && ls "$site"/nvidia/cu13/lib/libnvrtc.so.13* >/dev/null 2>&1; then
    mkdir -p "$W/lib"
    ln -sfn "$(ls "$site"/nvidia/cu13/lib/libnvrtc.so.13* | head -1)" "$W/lib/libnvrtc.so"
    export LD_LIBRARY_PATH="$PWD/$W/lib:$site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export SMELT_CUDA_INCLUDE="$site/nvidia/cu13/include"
    echo "gpu-check: NVRTC 13 from $site/nvidia/cu13" >&2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
data=$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')
mkdir -p .testdata && ln -sfn "$data" .testdata/onnx-data
if [[ $quick == 2 ]]; then
    flags=()
    [[ -n $budget ]] && flags=(--budget "$(( budget - SECONDS ))")
    python3 scripts/gpu_check.py --train-only --smelt "$W/smelt" --data - --variants - --train-runs "$W/train_runs" "${flags[@]}"
    exit
fi
# torchvision's models for the vision check, exported here where torchvision is.
vision=()
if [[ -f .testdata/vision/.done ]] || { python3 -c 'import torchvision' 2>/dev/null && echo "gpu-check: exporting torchvision's models" >&2 &&
    python3 scripts/make_vision.py --out .testdata/vision >&2; }; then
    vision=(--vision .testdata/vision)
else
    echo "gpu-check: no torchvision here: the vision check is skipped" >&2
fi
if [[ $quick == 3 ]]; then
    python3 scripts/gpu_check.py --vision-only --smelt "$W/smelt" --data - --variants - "${vision[@]}"
    exit
fi
if [[ ! -f .testdata/variants/.done ]]; then
    echo "gpu-check: generating the random-weight variants" >&2
    python3 scripts/make_variants.py --data "$data" --out .testdata/variants >&2
fi
status=0
if [[ $quick == 0 ]]; then
    echo "gpu-check: the GPU tests (tests/gpu.rs)" >&2
    SMELT_TESTDATA="$PWD/.testdata" timeout 150 "$W/gpu-tests" >&2 || { echo "gpu-check: GPU TESTS FAILED" >&2; status=1; }
fi
train=() flags=()
[[ $quick == 0 ]] && train=(--train-runs "$W/train_runs")
[[ $quick == 1 ]] && flags=(--quick)
[[ -n $budget ]] && flags+=(--budget "$(( budget - SECONDS ))")
[[ $quick == 0 ]] && train+=("${vision[@]}")
python3 scripts/gpu_check.py --smelt "$W/smelt" --data "$data" --variants .testdata/variants "${train[@]}" "${flags[@]}" || status=1
exit $status
