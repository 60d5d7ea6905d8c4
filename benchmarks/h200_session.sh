#!/usr/bin/env bash
# H200 calls that check the GPU kernels and re-measure every GPU table of docs/benchmarks.md.
# Usage (repo root, device machine): bash benchmarks/h200_session.sh [tests] [serving] [serving_bench] [decode] [decode_ab] [qps] [http] [http_si] [http_il] [ttft] [prefill] [overhead] [profile] [next] [families]
# Run from the repo root on the device machine, fla-core etc. on PYTHONPATH; results land in $OUT.
# Each step has its own time limit (TESTS_S, TTFT_S, PROFILE_S override three of them) so that a slow
# step cannot take the others' results with it.
#
# Compiling and autotuning the Triton kernels on a bare machine takes minutes (it used most of the
# 2026-11-29 call). Triton keeps binaries and fla's autotune results in TRITON_CACHE_DIR: the
# script restores it from .cache/triton/ (carry that folder) and packs it into $OUT/triton-cache.*
# at the end; copy those parts back to .cache/triton/ here for the next call or session.
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
if ls .cache/triton/triton-cache.txz.* >/dev/null 2>&1; then  # xz: 26 MB where gzip took 62 (carry limit 64 MiB)
  cat .cache/triton/triton-cache.txz.* | tar -xJf - -C "$TRITON_CACHE_DIR" && echo "restored Triton cache"
elif ls .cache/triton/triton-cache.tgz.* >/dev/null 2>&1; then
  cat .cache/triton/triton-cache.tgz.* | tar -xzf - -C "$TRITON_CACHE_DIR" && echo "restored Triton cache"
fi
# The device tool returns at most 8 files of 16 MiB from $OUT: logs and JSON go into one
# results.tgz, the Triton cache (xz) into 15 MiB parts.
pack_cache() { (cd "$OUT" && ls *.log *.json >/dev/null 2>&1 && tar -czf results.tgz *.log *.json && rm -f *.log *.json)
  # a cache hit loads only a kernel's metadata JSON and its cubin (and the launchers' .so): the IR texts
  # (llir, ptx, ttgir, ttir, source) are two thirds of the cache and stay behind
  (cd "$TRITON_CACHE_DIR" && tar -cf - --exclude='*.llir' --exclude='*.ptx' --exclude='*.ttgir' --exclude='*.ttir' \
    --exclude='*.source' . | xz -T0 -6) | split -b 15m -d - "$OUT/triton-cache.txz."; ls -la "$OUT"; }
trap pack_cache EXIT
step() { local t=$1 name=$2; shift 2; echo "== $name (limit ${t}s)"; local s=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s))s"; tail -n ${TAIL_N:-25} "$OUT/$name.log"; }
nvidia-smi -L
# The 40-layer Qwen3.5-35B-A3B shape needs an H200; on a smaller card (an H100 came for most device
# calls of 2026-12-07) the ttft, qps and serving_bench steps cut it to LAYERS (default 20 there; set
# LAYERS= to run the full model anyway, or another count), qps with a 14 GiB entry budget.
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ -z "${LAYERS+x}" ]; then LAYERS=""; [ "${GPU_MIB:-0}" -lt 100000 ] && LAYERS=20; fi
CUT=${LAYERS:+--layers $LAYERS}
QPS_CUT=${LAYERS:+--layers $LAYERS --entry-budget-gib 14}
echo "GPU memory ${GPU_MIB:-?} MiB; model layers: ${LAYERS:-all}"
# Steps to run: arguments (default: all, in this order). A cold machine needs ~2 calls for all of them;
# the GPU tests alone took >320 s with a partly cold Triton cache on 2026-11-29 (session 7).
STEPS=${*:-"tests ttft prefill overhead profile next"}
cd benchmarks
for st in $STEPS; do case $st in
  tests) (cd .. && for f in ${GPU_FILES:-$(grep -rlE "pytest.mark.gpu|mark\.gpu" tests --include="test_*.py" | sort)}; do
           step ${TEST_FILE_S:-150} "gputests_$(basename "$f" .py)" python3 -m pytest -q -rfE -p no:cacheprovider -m gpu \
             ${GPU_K:+-k "$GPU_K"} "$f"; done) ;;  # one time limit per file: a hang names its file
  serving) (cd .. && step ${SERVING_S:-300} gputests_serving python3 -m pytest -q -p no:cacheprovider -m gpu \
           tests/kernels/test_gpu_paged_attention.py tests/kernels/test_decode_slots.py tests/kernels/test_moe_route.py tests/kernels/test_gdn_gates.py \
           tests/runtime/test_gpu_runner.py) ;;
  decode) step ${DECODE_S:-300} decode python3 decode.py --shape qwen3_5_35b_a3b --batches 1 8 32 64 128 \
            --contexts 2048 20480 --out "$OUT/decode.json" ;;
  decode_ab) step ${DECODE_S:-300} decode_ab bash -c "python3 decode.py --shape qwen3_5_35b_a3b --batches 1 8 64 \
               --contexts 2048 20480 --profile --out $OUT/decode.json && python3 decode.py --shape qwen3_5_35b_a3b \
               --batches 1 8 --contexts 2048 --kernels fuse_projections=false --out $OUT/decode_unfused.json" ;;
  # QPS_ARGS replaces the default modes and loads (e.g. the issue-35 run: --modes hypic prefix_cache full_recompute
  # --loads 12 16 20 24 --mode-loads prefix_cache=0.5,1,1.5,2 full_recompute=0.5,1,1.5,2 --profile)
  qps) step ${QPS_S:-420} qps python3 qps.py --shape qwen3_5_35b_a3b $QPS_CUT ${QPS_ARGS:---modes prefix_cache hypic --loads 1 2 4 8 16} \
         --out "$OUT/qps.json" ;;
  # issue 36: decode through runner / scheduler / HTTP server, first-request, steady and idle TTFT (~5 min warm)
  # SERVING_ARGS: extra arguments (e.g. --layers 20 on an H100, where the 40-layer model does not fit)
  serving_bench) step ${SERVING_BENCH_S:-540} serving_bench python3 serving.py --shape qwen3_5_35b_a3b $CUT ${SERVING_ARGS:-} \
                   --out "$OUT/serving.json" ;;
  http|http_si) step ${HTTP_S:-240} $st python3 http_overhead.py --shape qwen3_5_35b_a3b --segments 20 --seg-len 1024 \
          --rate 2 $([ $st = http_si ] && echo "--switch-interval-ms ${SWITCH_MS:-0.5}") --out "$OUT/$st.json" ;;
  http_il) step ${HTTP_S:-300} http_il python3 http_overhead.py --shape qwen3_5_35b_a3b --segments 20 --seg-len 1024 \
             --rate 2 --interleave --requests ${HTTP_N:-48} --passes ${HTTP_PASSES:-3} --out "$OUT/http_il.json" ;;
  # TTFT_ARGS: extra arguments (e.g. --layers 20 --sync-audit --modes full_recompute prefix_cache hypic)
  ttft) step ${TTFT_S:-300} ttft python3 ttft.py --shape qwen3_5_35b_a3b --pool 120 --segments 20 --seg-len 1024 \
          --requests 5 --warmup 1 --hit-rates 1.0 0.8 $CUT ${TTFT_ARGS:-} --out "$OUT/ttft.json" ;;
  prefill) step 150 prefill python3 prefill.py --shape qwen3_5_35b_a3b --lengths 4096 16384 32768 --reps 2 \
             --out "$OUT/prefill.json" ;;
  overhead) step ${OVERHEAD_S:-200} overhead python3 overhead.py --shape qwen3_5_35b_a3b --layers 8 --segments 16 \
              --seg-len 1024 --out "$OUT/overhead.json" ;;
  profile) step ${PROFILE_S:-120} combine_profile python3 prefill_profile.py --shape qwen3_5_35b_a3b --layers 8 \
             --combine-only --scatter --out "$OUT/combine_profile.json" ;;
  next) step 100 prefill_next python3 prefill.py --shape qwen3_next_80b_a3b --layers 12 --lengths 32768 \
          --reps 2 --out "$OUT/prefill_next.json" ;;
  # issue 24: the new families' fla kernels (KDA, decay-only) and their real shapes, ~400 s in all; the tests
  # run first so that fla's autotuning of the shapes' head dims is done (and cached) before the timed runs
  # FAM_HF=--transformers-own-weights times transformers beside ours (its own random init, built and freed first)
  # FAM_TTFT_MODES="full_recompute hypic hypic@recurrent_scan_max_tokens=256": the short scans on fla's recurrent
  # kernels (capturable combine graphs) beside the chunked default
  families) [ "${FAM_TESTS_S:-140}" = 0 ] || (cd .. && step ${FAM_TESTS_S:-140} gputests_families python3 -m pytest -q -rfE -p no:cacheprovider -m gpu \
              tests/kernels/test_gpu_kda.py tests/kernels/test_gpu_decay_attention.py tests/runtime/test_gpu_families.py)
            [ "${FAM_PREFILL_S:-85}" = 0 ] || for sh in ${FAM_SHAPES:-kimi_linear_48b_a3b granite_4_0_h_small}; do
              step ${FAM_PREFILL_S:-85} "prefill_$sh" python3 prefill.py --shape $sh ${FAM_HF:---no-transformers} \
                ${FAM_LAYERS:+--layers $FAM_LAYERS} --lengths ${FAM_LENGTHS:-4096 16384 32768} --reps ${FAM_REPS:-2} \
                --out "$OUT/prefill_$sh.json"
            done
            [ "${FAM_TTFT_S:-45}" = 0 ] || for sh in ${FAM_SHAPES:-kimi_linear_48b_a3b granite_4_0_h_small}; do
              step ${FAM_TTFT_S:-45} "ttft_$sh" python3 ttft.py --shape $sh --pool 16 --segments 8 --seg-len 1024 \
                --requests ${FAM_REQUESTS:-5} --warmup ${FAM_WARMUP:-2} --hit-rates 1.0 --modes ${FAM_TTFT_MODES:-full_recompute hypic} --out "$OUT/ttft_$sh.json"
            done ;;
  *) echo "unknown step $st (tests serving serving_bench decode decode_ab qps http http_si http_il ttft prefill overhead profile next families)"; exit 2 ;;
esac; done
