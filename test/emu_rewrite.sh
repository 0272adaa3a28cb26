#!/usr/bin/env bash
# emu_rewrite.sh IN.cu OUT.cpp: rewrites CUDA launch syntax for the CPU emulation, keeping line
# numbers (a #line directive points errors at the real .cu):
#   K<<<grid, block[, smem[, stream]]>>>(args)  ->  emu::Launch(K, "K", __FILE__, __LINE__, grid, block...)(args)
#   extern __shared__ T name[];                 ->  T *name = (T *)emu::dyn_smem();
#   __shared__ T name[N]...;                    ->  static thread_local T name[N]...; emu::shared_fresh(...)
#     (one declarator, no initialiser, on one line; other forms keep the plain macro, unpoisoned)
set -e
in=$1; out=$2
{ printf '#line 1 "%s"\n' "$in"
  perl -pe 's/\b([A-Za-z_]\w*(?:\s*<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(/emu::Launch($1, "$1", __FILE__, __LINE__, $2)(/g;
            s/\bextern\s+__shared__\s+(.*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;/$1 *$2 = ($1 *)emu::dyn_smem();/g;
            s/(?<!extern )\b__shared__\s+([^;=,{}]*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*);/static thread_local $1$2$3; emu::shared_fresh(&$2, sizeof $2);/g' "$in"
} > "$out.tmp"
mv "$out.tmp" "$out"
