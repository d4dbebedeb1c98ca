#!/usr/bin/env bash
# The test command of README.md and CI: fetches the ONNX test data into the
# project (.venv, .testdata; nothing is committed), then runs every test.
# Needs a Rust toolchain and python3; no GPU, no CUDA toolkit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch-testdata.sh
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
