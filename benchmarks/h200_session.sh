#!/usr/bin/env bash
# One H200 call that checks the GPU kernels and re-measures every GPU table of docs/benchmarks.md.
# Run from the repo root on the device machine, fla-core etc. on PYTHONPATH; results land in $OUT.
# Each step has its own time limit so that a slow step cannot take the others' results with it.
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { local t=$1 name=$2; shift 2; echo "== $name (limit ${t}s)"; local s=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s))s"; tail -n 25 "$OUT/$name.log"; }
nvidia-smi -L
step 100 gputests python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu_norm.py \
  tests/kernels/test_gpu_gdn.py -k "norm or pairs or chain or gqa or Gqa or GQA"
cd benchmarks
step 160 ttft python3 ttft.py --shape qwen3_5_35b_a3b --pool 120 --segments 20 --seg-len 1024 --requests 5 \
  --warmup 1 --hit-rates 1.0 0.8 --out "$OUT/ttft.json"
step 100 prefill python3 prefill.py --shape qwen3_5_35b_a3b --lengths 16384 32768 --reps 2 --out "$OUT/prefill.json"
step 60 overhead python3 overhead.py --shape qwen3_5_35b_a3b --layers 8 --segments 16 --seg-len 1024 \
  --out "$OUT/overhead.json"
step 60 combine_profile python3 prefill_profile.py --shape qwen3_5_35b_a3b --layers 8 --combine-only \
  --out "$OUT/combine_profile.json"
step 70 prefill_next python3 prefill.py --shape qwen3_next_80b_a3b --layers 24 --lengths 32768 --reps 2 \
  --out "$OUT/prefill_next.json"
