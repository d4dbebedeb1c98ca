#!/usr/bin/env bash
# The emulator compiler's figures by test, from a SMELT_EMU_STATS file
# (one line per compile call: binary, test, kernels, cache hits, kernels
# compiled, units, compiler seconds summed over threads, wall seconds).
set -euo pipefail
printf "%8s %8s %8s %6s %10s %8s  %s\n" kernels hits compiled units "compile s" "wall s" "binary test"
awk -F'\t' '
    { sub(/-[0-9a-f]+( \(deleted\))?$/, "", $1); t = $1 " " $2
      k[t] += $3; h[t] += $4; c[t] += $5; u[t] += $6; s[t] += $7; w[t] += $8
      K += $3; H += $4; C += $5; U += $6; S += $7; W += $8 }
    END {
        for (t in k) printf "%8d %8d %8d %6d %10.1f %8.1f  %s\n", k[t], h[t], c[t], u[t], s[t], w[t], t
        printf "%8d %8d %8d %6d %10.1f %8.1f  %s\n", K, H, C, U, S, W, "~all"
    }' "${1:?usage: emu-stats.sh FILE}" | sort -k5 -nr
