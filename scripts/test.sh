#!/usr/bin/env bash
# The test command of README.md and CI: fetches the ONNX test data into the
# project (.venv, .testdata; nothing is committed), then runs every test.
# Needs a Rust toolchain and python3 (and installs g++ if missing); no GPU,
# no CUDA toolkit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch-testdata.sh
# The emulator tests compile the generated CUDA C with the host C++ compiler.
if ! command -v "${SMELT_CXX:-c++}" >/dev/null; then
    echo "test.sh: no C++ compiler: installing Debian's g++" >&2
    sudo=$([[ $(id -u) == 0 ]] || echo sudo)
    $sudo apt-get update -qq && $sudo apt-get install -y -qq g++ >&2
fi
# NVRTC from the venv's wheels: CUDA C compiles without a GPU.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SMELT_CUDA_INCLUDE="$site/nvidia/cuda_runtime/include"
# ptxas from nvidia-cuda-nvcc-cu12: registers and spills of every kernel.
export SMELT_PTXAS="$site/nvidia/cuda_nvcc/bin/ptxas"
export SMELT_REQUIRE_NVRTC=1
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
# The Python package, built from the tests' compiled crates (the dev
# profile) and tested against the CLI, onnxruntime and PyTorch, with the
# examples of README.md and docs/guide.md.
PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation ./python
SMELT_BIN="$PWD/target/debug/smelt" .venv/bin/python -m pytest -q -p no:cacheprovider python/tests
