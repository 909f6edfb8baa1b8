#!/usr/bin/env bash
# The CUDA end-to-end run, one command on a GPU machine with no network, from the repository root:
#   bash bench/gpu.sh            (results in $OUT, default ./out/gpu)
# The carried dependencies travel in the git-ignored folders .whl/ (wheels for Python 3.12) and .deb/ (Debian
# 12 packages): name both in the device tool's `carry`. Refill them on the development machine with the
# commands in docs/gpu.md.
# Stages, each timed: unpack the carried dependencies (.deb/ with dpkg -x into a private folder, .whl/ with
# pip --target), build the C++ runtime, server and pybind module in build/gpu, export the examples with
# --device cuda, self-check them with aotc-run, run `pytest -m cuda`, run bench/gpu_models.py. A stage
# that fails is reported and the stages after it still run where they can. Not for the CPU development
# machine (it has no CUDA).
# Writes to $OUT: summary.txt, build.log (machine and build), export.log, pytest.log, multi.log, gpu_multi_<k>.md,
# bench.log, gpu_bench.md and .json, eb.log and eb.json (bench/embedding_bag.py, started in the background with the
# build, since it compiles its own packages; the model benchmark waits for it so the GPU is not shared).
# The stages check, test, multi, bench, phases, pacing, probe, batching, memory and loopback run in the order AOTC_GPU_STAGES
# lists them.
# Knobs: AOTC_GPU_BUDGET_S (default 580: seconds the whole script may take; the benchmark gets what is
# left), AOTC_GPU_STAGES (default "deps build export test"; any of deps build export eb tuned check test multi
# bench phases pacing probe batching memory loopback), AOTC_TEST_TIMEOUT_S (default 340), AOTC_TEST_ARGS (what pytest
# runs, default "tests"; e.g. "tests/test_server_cuda.py -k outputs"),
# AOTC_EXPORT_FLAGS (more flags for the two exports, e.g. "--static-batches none" for a quicker run),
# AOTC_BENCH_ARGS (extra arguments for bench/gpu_models.py, e.g. "--skip compile-max-autotune"),
# AOTC_EXTRA_EXPORTS ("label=flags;...": more exports of bert_base, e.g. "freezing=--freezing on", each
# measured as its own aotc-run column),
# AOTC_EB_ARGS / AOTC_EB_TIMEOUT_S (default 420) for bench/embedding_bag.py,
# AOTC_EB_GPU / AOTC_TEST_GPU (CUDA_VISIBLE_DEVICES for the embedding-bag benchmark / for `pytest -m cuda`:
# on a two-GPU machine they can run side by side without sharing a GPU).
# Stage phases: bench/server_phases.py on the MLP (batch 64) and BERT (batch 1, 8) packages.
# Stage pacing: aotc-run on BERT (batch 1, 8) with idle gaps of 0, 200 and 1000 us between calls.
# Stage probe: BERT's call phases (AOTC_CUDA_TIMING) in aotc-run and in aotc-server at concurrency 1
# (one model loaded, then three), at the batch sizes in AOTC_PROBE_BATCHES (default "1"); AOTC_PROBE_CONFIGS
# picks the server's config sets (default "default runner,default,unbatched"); AOTC_PROBE_BUSY_POLL_US=N repeats
# each server part on a server started with --busy-poll-us N.
# Stage batching: bench/batching.py on BERT at concurrency 32 for bert_base.pt2 and each extra export.
# Stage memory: bench/gpu_memory.py, the size and device memory of bert_base.pt2 and each extra export.
# Stage loopback: bench/loopback.py, the floor of an answer of N bytes on this host's loopback TCP (no GPU).
# Stage multi (needs 2 GPUs; skips itself otherwise): the two-GPU server tests, then bench/gpu_multi.py once
# per instance count in AOTC_MULTI_INSTANCES (default "2"; instances per GPU).
# Stage tuned (a two-GPU machine, in the background on GPU $AOTC_TUNED_GPU, default 1, while the rest uses
# GPU 0): exports bert_base with --max-autotune, then runs bench/gpu_models.py's max-autotune parts
# (torch.compile mode max-autotune, aotc-run on that package) into gpu_bench_tuned.md. With it, the main
# benchmark leaves compile-max-autotune to it.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${AOTC_GPU_BUDGET_S:-580}
# The default is the validation run, which fits one 10-minute command: about 40 s deps and build, 190 s export,
# 280 s tests. Measurements are runs of their own (AOTC_GPU_STAGES; docs/benchmarks.md has each run's command).
STAGES=${AOTC_GPU_STAGES:-"deps build export test"}
DEPS=/tmp/aotc-deps          # unpacked .debs (never into /)
SITE=/tmp/aotc-site          # carried wheels
PKGS=/tmp/aotc-pkgs          # exported packages, shared by the tests and the benchmark
EXTRA=/tmp/aotc-pkgs-extra   # variants only the benchmark uses (freezing on, max-autotune)
BIN=/tmp/aotc-bin            # aotc, aotc-run, aotc-server on PATH
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/aotc-inductor-cache
export PYTHONPATH=$SITE:$ROOT/export:$ROOT/python_client${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$BIN:$DEPS/usr/bin:$PATH
export AOTC_CUDA_PACKAGES=$PKGS
export AOTC_SERVER_BIN=$BIN/aotc-server   # for the tests (tests/servers.py); the build links it there
PY=$(command -v python3)

say() { echo "[gpu.sh +$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
# stage NAME LOG CMD...: runs CMD with its output in LOG (and on the console), records time and status.
stage() {
  local name=$1 log=$2; shift 2
  if ! want "$name"; then say "stage $name: skipped (not in AOTC_GPU_STAGES)"; return 0; fi
  local t0=$(date +%s) rc
  say "stage $name: start"
  ( set -o pipefail; "$@" 2>&1 | tee -a "$log" )
  rc=$?
  say "stage $name: $( [ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)" ) in $(( $(date +%s) - t0 ))s"
  return $rc
}

# ---- deps: .deb -> $DEPS, .whl -> $SITE ---------------------------------------------------------------------
has_lib() { ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$1 .*x86-64"; }
sys_lib() { ldconfig -p 2>/dev/null | awk -v n="$1" '$1==n && /x86-64/ {print $NF; exit}'; }
deps() {
  rm -rf "$DEPS" "$SITE" && mkdir -p "$DEPS" "$SITE" "$BIN" "$PKGS"
  for deb in .deb/*.deb; do
    case $(basename "$deb") in
      # run-time libraries: only where the machine lacks them (its own are newer and already loaded)
      libssl3_*) has_lib libssl.so.3 && continue ;;
    esac
    dpkg -x "$deb" "$DEPS" || return 1
  done
  # -dev symlinks (libz.so -> libz.so.1.2.13) point at Debian's file names: aim the dangling ones at the
  # machine's library of the same soname.
  local lib
  for lib in "$DEPS"/usr/lib/x86_64-linux-gnu/*.so; do
    [ -L "$lib" ] && [ ! -e "$lib" ] || continue
    local soname real
    soname=$(basename "$(readlink "$lib")" | sed -E 's/^(lib[^.]+\.so\.[0-9]+).*/\1/')
    real=$(sys_lib "$soname")
    if [ -n "$real" ]; then ln -sf "$real" "$lib"; else echo "warning: $lib: no $soname on this machine"; fi
  done
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  "$PY" -c "import fastapi, uvicorn, tritonclient.http, gevent; print('wheels import: ok')"
}

# ---- build: aotc_runtime, aotc-run, aotc-server, aotc._runtime in build/gpu -----------------------------------
build() {
  local torch_prefix
  torch_prefix=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DAOTC_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DAOTC_DEPS_PREFIX="$DEPS" -DPython_EXECUTABLE="$PY" || return 1
  ninja -C build/gpu -k 0 -j"$(nproc)" || echo "warning: some targets failed to build (see above); going on with what built"
  grep -q "AOTC_WITH_CUDA" build/gpu/build.ninja && echo "CUDA runtime pieces: built" \
    || echo "CUDA runtime pieces: NOT built (this libtorch has no CUDA)"
  # aotc._runtime next to the aotc sources (this checkout is a throw-away copy), binaries on PATH
  find build/gpu -name '_runtime*.so' -exec cp {} export/aotc/ \;
  local exe
  for exe in aotc-run aotc-server aotc-load; do
    local p
    p=$(find build/gpu -type f -name "$exe" -perm -u+x | head -1)
    [ -n "$p" ] && ln -sf "$ROOT/$p" "$BIN/$exe" || echo "warning: $exe was not built"
  done
}

make_cli() {
  mkdir -p "$BIN"
  printf '#!/bin/sh\nexec %s -c "import sys; from aotc.cli import main; sys.exit(main())" "$@"\n' "$PY" >"$BIN/aotc"
  chmod +x "$BIN/aotc"
}

# ---- export: the examples for CUDA, both at once and while the C++ build runs ---------------------------------
export_start() {
  mkdir -p "$PKGS"
  ( aotc export models/mlp.py --device cuda --name mlp -o "$PKGS/mlp.pt2" ${AOTC_EXPORT_FLAGS:-} >"$PKGS/mlp.log" 2>&1
    echo $? >"$PKGS/mlp.rc" ) &
  EXPORT_PIDS="$!"
  ( aotc export models/bert.py:bert_base --device cuda --dtype fp16 --name bert_base -o "$PKGS/bert_base.pt2" \
      ${AOTC_EXPORT_FLAGS:-} >"$PKGS/bert_base.log" 2>&1
    echo $? >"$PKGS/bert_base.rc" ) &
  EXPORT_PIDS="$EXPORT_PIDS $!"
  EXPORTED="$PKGS/mlp $PKGS/bert_base"
  # AOTC_EXTRA_EXPORTS="label=aotc export flags;...": more exports of bert_base for the benchmark to compare
  local spec label flags
  IFS=';' read -ra specs <<<"${AOTC_EXTRA_EXPORTS:-}"
  for spec in "${specs[@]}"; do
    [ -n "$spec" ] || continue
    label=${spec%%=*}; flags=${spec#*=}
    mkdir -p "$EXTRA"
    ( aotc export models/bert.py:bert_base --device cuda --dtype fp16 $flags --name bert_base \
        -o "$EXTRA/bert_base_$label.pt2" >"$EXTRA/bert_base_$label.log" 2>&1
      echo $? >"$EXTRA/bert_base_$label.rc" ) &
    EXPORT_PIDS="$EXPORT_PIDS $!"
    EXPORTED="$EXPORTED $EXTRA/bert_base_$label"
  done
}
export_report() {
  local ok=0 m
  for m in $EXPORTED; do
    echo "== aotc export $(basename "$m"): exit $(cat "$m.rc" 2>/dev/null || echo '?')"
    cat "$m.log" 2>/dev/null
    [ "$(cat "$m.rc" 2>/dev/null)" = 0 ] || ok=1
  done
  return $ok
}

# ---- check: every package self-checked by the C++ runtime, with and without CUDA graphs ----------------------
# A crash (signal) is diagnosed once: a backtrace from cuda-gdb, then the same call with libstdc++ preloaded.
# If that preload cures it, aotc-run and aotc-server on PATH become wrappers that preload it for the rest
# of the run, and the summary says so (a workaround to report, not a fix).
preload_wrappers() {
  local exe real
  for exe in aotc-run aotc-server; do
    [ -L "$BIN/$exe" ] || continue
    real=$(readlink -f "$BIN/$exe")
    rm -f "$BIN/$exe"
    printf '#!/bin/sh\nLD_PRELOAD=libstdc++.so.6${LD_PRELOAD:+:$LD_PRELOAD} exec %s "$@"\n' "$real" >"$BIN/$exe"
    chmod +x "$BIN/$exe"
  done
}
# server_smoke: aotc-server loads the MLP package and answers ready; returns the server's exit status if it
# dies (>= 128 on a signal), 1 if it never gets ready.
server_smoke() {
  local repo=/tmp/aotc-smoke-repo port=18765 pid i
  rm -rf "$repo" && mkdir -p "$repo/mlp/1" && ln -s "$PKGS/mlp.pt2" "$repo/mlp/1/model.pt2"
  aotc-server --model-repository "$repo" --http-port $port &
  pid=$!
  for i in $(seq 120); do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; return $?; fi
    if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v2/models/mlp/ready', timeout=1)" \
        2>/dev/null; then
      kill $pid; wait $pid; echo "aotc-server: mlp ready"; return 0
    fi
    sleep 0.5
  done
  kill $pid; wait $pid; echo "aotc-server: mlp not ready after 60 s"; return 1
}
check_packages() {
  local pkg flags rc ok=0 diagnosed=no
  for pkg in "$PKGS"/*.pt2; do
    for flags in "" "--no-cuda-graphs"; do
      echo "== aotc-run $(basename "$pkg") $flags"
      timeout 120 aotc-run "$pkg" $flags; rc=$?
      echo "exit $rc"
      if [ $rc -ge 128 ] && [ $diagnosed = no ]; then
        diagnosed=yes
        command -v cuda-gdb >/dev/null && timeout 60 cuda-gdb -q -batch -ex run -ex bt \
          --args "$(readlink -f "$BIN/aotc-run")" "$pkg" $flags 2>&1 | grep -A12 "received signal"
        echo "-- again with LD_PRELOAD=libstdc++.so.6:"
        LD_PRELOAD=libstdc++.so.6 timeout 120 aotc-run "$pkg" $flags; rc=$?
        echo "exit $rc"
        if [ $rc = 0 ]; then
          say "WORKAROUND: aotc-run crashed without libstdc++ preloaded; aotc-run/aotc-server now preload it"
          preload_wrappers
        fi
      fi
      [ $rc = 0 ] || ok=1
    done
  done
  echo "== aotc-server with the mlp package"
  server_smoke; rc=$?
  if [ $rc -ge 128 ] && [ $diagnosed = no ]; then
    echo "aotc-server died (exit $rc); again with LD_PRELOAD=libstdc++.so.6:"
    LD_PRELOAD=libstdc++.so.6 server_smoke; rc=$?
    if [ $rc = 0 ]; then
      say "WORKAROUND: aotc-server crashed without libstdc++ preloaded; aotc-run/aotc-server now preload it"
      preload_wrappers
    fi
  fi
  [ $rc = 0 ] || ok=1
  return $ok
}

env_report() {
  {
    date -u; uname -a; nproc
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
    "$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda",
      torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
    command -v nvcc && nvcc --version | tail -2; g++ --version | head -1; cmake --version | head -1
    for l in libssl.so.3 libcrypto.so.3 libz.so.1; do echo "$l: $(sys_lib $l)"; done
    for h in openssl/ssl.h zlib.h boost/beast/http.hpp rapidjson/document.h; do
      [ -e /usr/include/$h ] && echo "system has $h" || echo "system lacks $h"; done
  } >>"$OUT/build.log" 2>&1
}

env_report
make_cli
stage deps "$OUT/build.log" deps
T_EXPORT=$(date +%s)
want export && export_start
if want eb; then
  say "stage eb: started in the background (bench/embedding_bag.py --device cuda)"
  ( [ -n "${AOTC_EB_GPU:-}" ] && export CUDA_VISIBLE_DEVICES=$AOTC_EB_GPU
    t0=$(date +%s); timeout "${AOTC_EB_TIMEOUT_S:-420}" "$PY" bench/embedding_bag.py --device cuda \
      --json "$OUT/eb.json" ${AOTC_EB_ARGS:-} >"$OUT/eb.log" 2>&1
    echo "exit $? in $(( $(date +%s) - t0 ))s" >>"$OUT/eb.log" ) &
  EB_PID=$!
fi
tuned() {
  export CUDA_VISIBLE_DEVICES=${AOTC_TUNED_GPU:-1}
  mkdir -p "$EXTRA"
  local t0=$(date +%s) i
  aotc export models/bert.py:bert_base --device cuda --dtype fp16 --max-autotune --name bert_base \
    -o "$EXTRA/bert_base_ma.pt2" || echo "max-autotune export failed"
  echo "max-autotune export: $(( $(date +%s) - t0 ))s"
  for i in $(seq 120); do [ -x "$BIN/aotc-run" ] && break; sleep 2; done  # the build runs meanwhile
  local left=$(( BUDGET - ($(date +%s) - START) - 10 ))
  timeout "$left" "$PY" bench/gpu_models.py --packages "$PKGS" --only compile-max-autotune,aotc-run-extra \
    --extra "max-autotune=$EXTRA/bert_base_ma.pt2" --budget-s $(( left - 10 )) --out "$OUT/gpu_bench_tuned.md"
}
if want tuned; then
  say "stage tuned: started in the background on GPU ${AOTC_TUNED_GPU:-1}"
  ( t0=$(date +%s); tuned >"$OUT/tuned.log" 2>&1; echo "exit $? in $(( $(date +%s) - t0 ))s" >>"$OUT/tuned.log" ) &
  TUNED_PID=$!
fi
stage build "$OUT/build.log" build
if want export; then
  say "stage export: waiting (started with the build)"
  wait $EXPORT_PIDS
  ( set -o pipefail; export_report 2>&1 | tee -a "$OUT/export.log" )
  rc=$?
  say "stage export: $( [ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)" ) in $(( $(date +%s) - T_EXPORT ))s" \
    "(both models, in parallel with the build)"
fi
# ---- the stages that take turns, in the order AOTC_GPU_STAGES names them ------------------------------------
wait_eb() {
  [ -n "${EB_PID:-}" ] || return 0
  say "waiting for the embedding-bag benchmark"; wait "$EB_PID"; say "embedding-bag benchmark: $(tail -1 "$OUT/eb.log")"
  EB_PID=""
}
# multi: two GPUs, one server (the test file and the benchmark skip themselves below 2 GPUs)
multi() {
  "$PY" -m pytest -m cuda -q -p no:cacheprovider --timeout=120 -rs tests/test_server_instances.py || return 1
  local k
  for k in ${AOTC_MULTI_INSTANCES:-2}; do  # instances per GPU; each count is its own one-run comparison
    "$PY" bench/gpu_multi.py --packages "$PKGS" --instances "$k" --seconds "${AOTC_MULTI_SECONDS:-8}" \
      --out "$OUT/gpu_multi_$k.md" || return 1
  done
}
bench() {
  local left=$(( BUDGET - ($(date +%s) - START) )) args="" f
  say "benchmark budget: ${left}s"
  for f in "$EXTRA"/bert_base_*.pt2; do  # the extra exports of bert_base, each its own aotc-run column
    [ -f "$f" ] && args="$args --extra $(basename "$f" .pt2 | sed 's/^bert_base_//')=$f"
  done
  want tuned && args="$args --skip compile-max-autotune"
  env ${TUNED_PID:+CUDA_VISIBLE_DEVICES=0} "$PY" bench/gpu_models.py --packages "$PKGS" --budget-s "$left" \
    --out "$OUT/gpu_bench.md" $args ${AOTC_BENCH_ARGS:-}
}
# phases: where a request's time goes at concurrency 1 (in-process vs HTTP, with the server's own phase times)
phases() {
  "$PY" bench/server_phases.py --package "$PKGS/mlp.pt2" --batch 64 --out "$OUT/phases_mlp.md" || return 1
  "$PY" bench/server_phases.py --package "$PKGS/bert_base.pt2" --batch 1 8 --out "$OUT/phases_bert.md"
}
# BERT inputs for aotc-run: /tmp/aotc-ids-b1.npy and /tmp/aotc-ids-b8.npy
make_ids() {
  "$PY" -c "
import numpy as np
for b in (1, 8):
    np.save('/tmp/aotc-ids-b%d.npy' % b, np.random.default_rng(b).integers(0, 1000, (b, 128)).astype(np.int64))"
}
# pacing: aotc-run on BERT with idle gaps between calls (--gap-us), as a server's calls arrive at concurrency 1:
# whether the model call itself slows when the machine idles between calls. Three rounds, interleaved.
pacing() {
  make_ids
  local round b gap
  for round in 1 2 3; do
    for b in 1 8; do
      for gap in 0 200 1000; do
        echo "round $round batch $b gap_us $gap: $(aotc-run "$PKGS/bert_base.pt2" /tmp/aotc-ids-b$b.npy --bench 2000 \
          --warmup 200 --gap-us $gap | grep '^bench:')"
      done
    done
  done
}
# probe: where BERT's call time goes (AOTC_CUDA_TIMING: host and device phases of each replayed call) in
# aotc-run, back to back and paced, and in aotc-server at concurrency 1 with one copy of the model loaded,
# then with three (the configs of stage phases). AOTC_PROBE_BATCHES (default "1"): the batch sizes;
# AOTC_PROBE_CONFIGS (default "default runner,default,unbatched"): the server's config sets.
probe() {
  make_ids
  local gap configs b
  for b in ${AOTC_PROBE_BATCHES:-1}; do
    for gap in 0 200; do
      echo "== aotc-run --gap-us $gap, batch $b"
      AOTC_CUDA_TIMING=1000 aotc-run "$PKGS/bert_base.pt2" /tmp/aotc-ids-b$b.npy --bench 3000 --warmup 300 \
        --gap-us $gap 2>&1 | grep -E '^bench:|cuda timing' | tail -3
    done
    for configs in ${AOTC_PROBE_CONFIGS:-default runner,default,unbatched}; do
      echo "== aotc-server, configs $configs, batch $b, concurrency 1"
      AOTC_CUDA_TIMING=1000 "$PY" bench/server_phases.py --package "$PKGS/bert_base.pt2" --batch $b \
        --configs $configs --rounds 2 --seconds 3 --server-log "$OUT/probe_server_${configs}_b$b.log" \
        --out "$OUT/probe_${configs}_b$b.md" || return 1
      grep "cuda timing" "$OUT/probe_server_${configs}_b$b.log" | tail -5
      if [ -n "${AOTC_PROBE_BUSY_POLL_US:-}" ]; then
        echo "== the same, aotc-server --busy-poll-us $AOTC_PROBE_BUSY_POLL_US"
        AOTC_CUDA_TIMING=1000 "$PY" bench/server_phases.py --package "$PKGS/bert_base.pt2" --batch $b \
          --configs $configs --rounds 2 --seconds 3 --busy-poll-us "$AOTC_PROBE_BUSY_POLL_US" \
          --server-log "$OUT/probe_server_${configs}_b${b}_busy.log" --out "$OUT/probe_${configs}_b${b}_busy.md" || return 1
        grep "cuda timing" "$OUT/probe_server_${configs}_b${b}_busy.log" | tail -5
      fi
    done
  done
}
# batching: bench/batching.py, BERT batch-1 requests at concurrency 32, batched against unbatched, for the
# default package and each extra export of it (AOTC_EXTRA_EXPORTS), side by side in one server
batching() {
  local args="--package default=$PKGS/bert_base.pt2" f
  for f in "$EXTRA"/bert_base_*.pt2; do
    [ -f "$f" ] && args="$args --package $(basename "$f" .pt2 | sed 's/^bert_base_//')=$f"
  done
  "$PY" bench/batching.py $args --concurrency 32 --seconds 4 --rounds 2 --out "$OUT/batching.md"
}
# memory: each BERT package's size and the device memory a loaded session holds (bench/gpu_memory.py)
memory() {
  local args="default=$PKGS/bert_base.pt2" f
  for f in "$EXTRA"/bert_base_*.pt2; do
    [ -f "$f" ] && args="$args $(basename "$f" .pt2 | sed 's/^bert_base_//')=$f"
  done
  "$PY" bench/gpu_memory.py $args --out "$OUT/memory.md"
}
for s in $STAGES; do
  case $s in
    loopback) wait_eb; stage loopback "$OUT/loopback.log" "$PY" bench/loopback.py --seconds 2 --rounds 3 \
                --out "$OUT/loopback.md" ;;
    memory) wait_eb; stage memory "$OUT/memory.log" memory ;;
    phases) wait_eb; stage phases "$OUT/phases.log" phases ;;
    pacing) wait_eb; stage pacing "$OUT/pacing.log" pacing ;;
    probe) wait_eb; stage probe "$OUT/probe.log" probe ;;
    batching) wait_eb; stage batching "$OUT/batching.log" batching ;;
    check) stage check "$OUT/export.log" check_packages ;;
    test)
      [ -z "${AOTC_EB_GPU:-}" ] && wait_eb  # without a GPU of its own, the benchmark must not share one
      stage test "$OUT/pytest.log" env ${AOTC_TEST_GPU:+CUDA_VISIBLE_DEVICES=$AOTC_TEST_GPU} \
        timeout "${AOTC_TEST_TIMEOUT_S:-340}" "$PY" -m pytest -m cuda -q -p no:cacheprovider --timeout=120 -rs \
        ${AOTC_TEST_ARGS:-tests} ;;
    multi) wait_eb; stage multi "$OUT/multi.log" multi ;;
    bench) [ -z "${AOTC_EB_GPU:-}" ] && wait_eb; stage bench "$OUT/bench.log" bench ;;
  esac
done
wait_eb
if [ -n "${TUNED_PID:-}" ]; then
  say "waiting for stage tuned"; wait "$TUNED_PID"; say "stage tuned: $(tail -1 "$OUT/tuned.log")"
fi
say "done in $(( $(date +%s) - START ))s"
