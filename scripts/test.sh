#!/usr/bin/env bash
# The test command of README.md and CI: fetches the ONNX test data into the
# project (.venv, .testdata; nothing is committed), then runs every test.
# Needs a Rust toolchain and python3 (and installs g++ if missing); no GPU,
# no CUDA toolkit. Uses cargo-nextest where installed (every test binary's
# tests in one pool on all cores), else `cargo test`.
#
# SMELT_EMU_STATS=FILE: the emulator's compiler appends a line per call
# (test, kernels, cache hits, compiled, units, seconds); the run ends with
# the table by test (scripts/emu-stats.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
stamp() { echo "test.sh: $* at $((SECONDS - start)) s" >&2; }
mkdir -p target
# The test data (PyTorch alone is 5 GB to install on a cold machine) is
# fetched while the Rust tests build: the one waits on the network and the
# disk, the other on the cores.
scripts/fetch-testdata.sh >target/fetch-testdata.log 2>&1 &
fetch=$!
# The emulator tests compile the generated CUDA C with the host C++ compiler.
if ! command -v "${SMELT_CXX:-c++}" >/dev/null; then
    echo "test.sh: no C++ compiler: installing Debian's g++" >&2
    sudo=$([[ $(id -u) == 0 ]] || echo sudo)
    $sudo apt-get update -qq && $sudo apt-get install -y -qq g++ >&2
fi
if cargo nextest --version >/dev/null 2>&1; then
    nextest=1
    cargo nextest run --workspace --all-targets --no-run "$@"
else
    nextest=
    cargo test --workspace --all-targets --no-run "$@"
fi
stamp "tests built"
if ! wait $fetch; then
    cat target/fetch-testdata.log >&2
    echo "test.sh: scripts/fetch-testdata.sh failed" >&2
    exit 1
fi
cat target/fetch-testdata.log >&2
stamp "test data ready"
# NVRTC from the venv's wheels: CUDA C compiles without a GPU.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SMELT_CUDA_INCLUDE="$site/nvidia/cuda_runtime/include"
# ptxas from nvidia-cuda-nvcc-cu12: registers and spills of every kernel.
export SMELT_PTXAS="$site/nvidia/cuda_nvcc/bin/ptxas"
export SMELT_REQUIRE_NVRTC=1
# Snapshots: a difference fails (no variable of the caller's accepts it),
# and every snapshot file must be one a test compared against.
export INSTA_UPDATE=no INSTA_FORCE_PASS=0
refs=$PWD/target/insta-references.txt
rm -f "$refs"
export INSTA_SNAPSHOT_REFERENCES_FILE=$refs
if [[ $nextest ]]; then
    cargo nextest run --workspace --all-targets "$@"
else
    cargo test --workspace --all-targets "$@"
fi
stamp "tests run"
cargo test --workspace --doc
stamp "doctests run"
unreferenced=$(comm -23 <(git ls-files '*.snap' | sed "s|^|$PWD/|" | sort) <(sort -u "$refs"))
if [[ $unreferenced ]]; then
    echo "test.sh: snapshots that no test compares against (delete them, or the test that lost them):" >&2
    echo "$unreferenced" >&2
    exit 1
fi
pending=$(find . -path ./target -prune -o \( -name '*.snap.new' -o -name '*.pending-snap' \) -print)
if [[ $pending ]]; then
    echo "test.sh: pending snapshots left by the run: $pending" >&2
    exit 1
fi
# The Python package, built from the tests' compiled crates (the dev
# profile) and tested against the CLI, onnxruntime and PyTorch, with the
# examples of README.md and docs/guide.md.
PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation ./python
SMELT_BIN="$PWD/target/debug/smelt" .venv/bin/python -m pytest -q -p no:cacheprovider python/tests
stamp "python tests run"
if [[ ${SMELT_EMU_STATS:-} ]]; then
    scripts/emu-stats.sh "$SMELT_EMU_STATS"
fi
