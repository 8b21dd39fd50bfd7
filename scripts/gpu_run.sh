#!/usr/bin/env bash
# Run the GPU tests and benchmarks on a CUDA machine that has torch but no package
# registry, with the offline DSL bundle in .gpu/ (docs/development.md). Writes logs and
# JSON under $OUT.
# Usage: bash scripts/gpu_run.sh [tests|bench|bars|small|autotune|all] [pytest paths/args...]
#        bash scripts/gpu_run.sh cmd COMMAND...   (any command in the same environment)
#        bash scripts/gpu_run.sh ptests [JOBS]     (tests/gpu files spread over JOBS pytest
#                                                   processes sharing the GPU: compile-bound)
#   all = tests + bench; autotune (compile speed-ups and tuning sweeps) runs on its own.
#   tests with paths runs those instead of all of tests/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
source .gpu/env.sh || exit 3
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-}
export OUT=${OUT:-/tmp/cuteforge-out}
mkdir -p "$OUT"
export CUTEFORGE_CACHE_DIR=${CUTEFORGE_CACHE_DIR:-/tmp/cuteforge-cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  [ $# -gt 0 ] || set -- tests/gpu
  python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m cuteforge info
  python3 -m cuteforge library --quick 2>&1 | tee "$OUT/library.log"
  python3 benchmarks/bench_dispatch.py --out "$OUT/h200-dispatch.json" 2>&1 | tail -20
  python3 benchmarks/bench_sum.py --out "$OUT/h200-sum.json" 2>&1 | tee "$OUT/bench-sum.log" | tail -60
fi
if [ "$what" = bars ]; then
  # The headline measurements (~6-8 min on an H200 with a cold cache), files named after
  # the card: GEMM (bar shapes, squares, skinny LLM shapes, fused epilogues) and the
  # memory-bound ops at N >= 4096, forward and backward.
  tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace('nvidia ', '').split()[0])")
  python3 benchmarks/bench_gemm.py --set bar,square,skinny,epilogue,shortk --out "$OUT/$tag-gemm-bars.json" 2>&1 | tail -40 || rc=1
  python3 benchmarks/bench_membound.py --ops layer_norm,rms_norm,softmax,sum --ns 4096,16384,65536,131072,262144 \
    --no-compile --out "$OUT/$tag-membound-bars.json" 2>&1 | tail -60 || rc=1
  # the forward bars again with a clean L2 flush (bench_membound.py --flush read): the default
  # flush leaves dirty lines whose write-back a short read-only kernel pays (sum bf16 32768 x
  # 4096: 88 % against 99 %, docs/kernels/reduce.md)
  python3 benchmarks/bench_membound.py --ops layer_norm,rms_norm,softmax,sum --ns 4096,16384,65536,131072,262144 \
    --no-compile --no-backward --flush read --out "$OUT/$tag-membound-bars-readflush.json" 2>&1 | tail -40 || rc=1
  # LayerNorm's long-row defaults (the H200's picks) against the H100's lagged picks and
  # the unlagged shapes, kernel alone, in one process
  python3 benchmarks/bench_norm_staged.py --fwd --ops layer_norm --dtypes bfloat16,float16,float32 \
    --ns 32768,65536,131072,262144 --defaults-only --no-quack \
    --configs "NormConfig(512,512,4,3,exchange='mbar',stages=2,lag=1);NormConfig(256,256,16,1,exchange='mbar',stages=3,lag=1);NormConfig(512,512,4,1,exchange='mbar',stages=6);NormConfig(256,256,8,1,exchange='mbar',stages=4)" \
    --out "$OUT/$tag-norm-fwd-layer-defaults-check.json" 2>&1 | grep default || rc=1
fi
if [ "$what" = small ]; then
  # small-N and small-M rows (the goal: never slower than torch eager), forward and backward
  # through autograd, timed back to back (--timer stream: these calls are host-bound, and one
  # event pair around one call reads the host's jitter; library_bench.measure)
  tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace('nvidia ', '').split()[0])")
  ops=${SMALL_OPS:-sum,softmax,log_softmax,rms_norm,layer_norm,cross_entropy}
  # SMALL_REPEAT=K: each shape timed K times (median, and each run's ratio kept): a cell
  # within a few percent of torch needs it to tell a gap from one run's noise
  python3 benchmarks/bench_membound.py --ops $ops --ns 256,512,1024,2048 --no-compile --no-quack --timer stream \
    --repeat "${SMALL_REPEAT:-1}" --out "$OUT/$tag-membound-smalln-stream.json" 2>&1 | tail -30 || rc=1
  for m in 1 8 128; do
    python3 benchmarks/bench_membound.py --ops $ops --ns 256,4096,32768 --m $m --no-compile --no-quack --timer stream \
      --repeat "${SMALL_REPEAT:-1}" --out "$OUT/$tag-membound-smallm-$m-stream.json" 2>&1 | tail -30 || rc=1
  done
fi
if [ "$what" = autotune ]; then
  python3 benchmarks/bench_autotune.py --out "$OUT/h200-autotune.json" 2>&1 | tee "$OUT/bench-autotune.log" | tail -60
fi
if [ "$what" = ptests ]; then
  jobs=${1:-4}
  # Timing tests (the autotuner's) run alone afterwards: parallel load would skew them.
  mapfile -t files < <(ls tests/gpu/test_*.py | grep -v autotune)
  pids=()
  for ((j = 0; j < jobs; j++)); do
    group=()
    for ((k = j; k < ${#files[@]}; k += jobs)); do group+=("${files[k]}"); done
    [ ${#group[@]} -gt 0 ] || continue
    python3 -m pytest -q -p no:cacheprovider -rfE "${group[@]}" > "$OUT/ptests-$j.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_autotune_gpu.py > "$OUT/ptests-z.log" 2>&1 || rc=1
  cat "$OUT"/ptests-*.log > "$OUT/gpu-tests.log"; rm -f "$OUT"/ptests-*.log
  grep -E "passed|failed|error|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -60
fi
if [ "$what" = cmd ]; then
  "$@"
  rc=$?
fi
exit $rc
