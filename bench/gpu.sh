#!/usr/bin/env bash
# The CUDA end-to-end run on a GPU machine with no network, one command from the repository root. Stages are
# arguments, choices are options, the environment gives paths only (OUT): `bash bench/gpu.sh --help`.
# It needs the carried dependencies in the git-ignored folders .whl/ and .deb/ (docs/gpu.md says how to
# refill them). A stage that fails is reported and the stages after it still run where they can. Not for the
# CPU development machine (it has no CUDA).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ALL_STAGES="deps build export eb tuned check test multi bench phases pacing probe batching memory loopback warmup seqbench pa threads beside tune"

usage() {
  cat <<'EOF'
usage: bash bench/gpu.sh [OPTION ...] [STAGE ...]

Runs the STAGEs (default: deps build export test, the validation run) and writes what they report to $OUT
(default ./out/gpu): summary.txt (each stage's time and status) and the files named below.

Stages deps, build, export, eb and tuned run first, whatever their order here:
  deps      unpack .deb/ (dpkg -x) into /tmp/aotc-deps, install .whl/ (pip --target) into /tmp/aotc-site
  build     CMake + Ninja in build/gpu; aotc-run, aotc-server, aotc-load on PATH; aotc._runtime   build.log
  export    models/mlp.py fp32, models/bert.py:bert_base and models/embedding_answer.py fp16 for CUDA into
            /tmp/aotc-pkgs, and each
            --extra-export of bert_base, all in parallel with the build                        export.log
  eb        bench/embedding_bag.py --device cuda, in the background from the start      eb.log, eb.json
  tuned     (2 GPUs) the --max-autotune export and gpu_models.py's max-autotune parts, in the background
            on --tuned-gpu while the rest uses GPU 0                       tuned.log, gpu_bench_tuned.md
The others run in the order given:
  check     aotc-run self-check of each package, with and without CUDA graphs; aotc-server smoke test
  test      pytest -m cuda on --test-args                                                      pytest.log
  multi     (2 GPUs) tests/test_server_instances.py, then bench/gpu_multi.py per --multi-instances count
                                                                              multi.log, gpu_multi_K.md
  bench     bench/gpu_models.py with what is left of --budget-s              bench.log, gpu_bench.{md,json}
  phases    bench/server_phases.py on the MLP (batch 64) and BERT (batch 1, 8)      phases_{mlp,bert}.md
  pacing    aotc-run on BERT (batch 1, 8) with idle gaps of 0, 200 and 1000 us between calls    pacing.log
  probe     BERT's call phases (AOTC_CUDA_TIMING) in aotc-run and in aotc-server           probe*.{log,md}
  batching  bench/batching.py: BERT at concurrency 32, batched against unbatched, per package  batching.md
  memory    bench/gpu_memory.py: each BERT package's size and its device memory once loaded     memory.md
  loopback  bench/loopback.py: the floor of an N-byte answer over loopback TCP (no GPU)        loopback.md
  warmup    bench/warmup.py: BERT's first 200 answers after a hot reload, warm-up on and off    warmup.md
  seqbench  bench/seq_buckets.py: BERT-base fp16, lengths 8..128 at concurrency 32: sequence buckets
            32,64,128 against one padded shape and a dynamic sequence dim (--variants: also packed
            rows, --seq-pack)                                                    seq_buckets.{log,md}
  tune      bench/tune_targets.py: aotc tune of BERT-base fp16 at concurrency 32, budget 2x the unbatched
            p50, variants default and no-static-batches, against the default configuration and the most
            any configuration could reach (each variant alone in aotc-run)                          tune.md
  pa        bench/perf_analyzer.py (Triton's perf_analyzer, carried in .gpu/) on BERT at concurrency 1, HTTP
            and gRPC: batch 8 with inputs and outputs in the body, in system and in CUDA shared memory;
            batch 1 (body and system shared memory, 2 rounds), with models/embedding_answer.py beside it (an
            answer of BERT's size without its compute), and each over both transports with aotc-load too (a
            client that takes the answer as bytes), against the call in the process (aotc-run)
                                                                                  pa_b8.md, pa_b1.md, pa.log
  threads   bench/thread_cpu.py: BERT and the answer model at batch 1, concurrency 1, each in a server of
            its own (--threads-args "--layout both": and in one server, in turn), over HTTP and gRPC with
            aotc-load, the server with and without --busy-poll-us 200, aotc-load with and without --busy-poll: the
            server's CPU and context switches per request, thread by thread, the client's, the call in the
            process, and the model call's phases in the server per transport
            (AOTC_CUDA_TIMING=--cuda-timing)                                                  threads.md
  beside    bench/beside.py: BERT's call alone and beside a companion, a fresh process each (the answer
            model, the MLP, a second BERT, 1 and 2 trivial torch CUDA graphs): loaded, graphs captured,
            gone; its graph on the device (AOTC_CUDA_TIMING)                                   beside.md

Options (--opt VALUE or --opt=VALUE; defaults in brackets):
  --budget-s S             seconds the whole run may take; bench gets what is left [580]
  --test-timeout-s S       limit of the test stage [340]
  --test-args "ARGS"       what pytest runs [tests], e.g. "tests/test_server_cuda.py -k outputs"
  --test-gpu N             CUDA_VISIBLE_DEVICES of the test stage [all GPUs]
  --export-flags "FLAGS"   more aotc export flags for both exports, e.g. "--static-batches none"
  --extra-export L=FLAGS   one more export of bert_base with FLAGS, labelled L, that bench, batching and
                           memory measure beside the default one; repeatable, e.g. "freezing=--freezing on"
  --bench-args "ARGS"      more bench/gpu_models.py arguments, e.g. "--only aotc-run,aotc-server"
  --eb-args "ARGS"         more bench/embedding_bag.py arguments
  --eb-timeout-s S         limit of the eb stage [420]
  --eb-gpu N               CUDA_VISIBLE_DEVICES of the eb stage; without it, test and bench wait for eb
  --tuned-gpu N            the GPU of the tuned stage [1]
  --multi-instances "K.."  instances per GPU, one bench/gpu_multi.py run each ["2"]
  --multi-seconds S        measured seconds per bench/gpu_multi.py cell [8]
  --probe-batches "B.."    batch sizes of the probe stage ["1"]
  --probe-configs "C.."    the server's config sets in the probe stage, each a comma-separated list of
                           bench/server_phases.py --configs names ["default runner,default,unbatched"]
  --probe-busy-poll-us N   also run each probe server part on a server started with --busy-poll-us N
  --cuda-timing N          AOTC_CUDA_TIMING of the probe and threads stages: means every N replayed calls [1000]
  --tune-min M             the tune stage's aotc tune --budget-min [3]; 0: no search, the default against the bound
  --threads-args "ARGS"    more bench/thread_cpu.py arguments of the threads stage, e.g. "--layout both"
  --seq-args "ARGS"        more bench/seq_buckets.py arguments of the seqbench stage, e.g. "--outputs json";
                           repeatable: one run each (seq_buckets.md, then seq_buckets_2.md, ...)
  -h, --help               this text

Environment: OUT, where the results go. The script sets AOTC_SERVER_BIN and AOTC_CUDA_PACKAGES for the tests.
EOF
}
die() { echo "gpu.sh: $*; see bash bench/gpu.sh --help" >&2; exit 2; }
whole() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 takes a whole number, got '$2'"; }
wholes() { [[ $2 =~ ^[0-9]+( [0-9]+)*$ ]] || die "$1 takes whole numbers separated by spaces, got '$2'"; }

BUDGET=580 TEST_TIMEOUT_S=340 TEST_ARGS=tests TEST_GPU="" EXPORT_FLAGS="" EXTRA_EXPORTS=() BENCH_ARGS=""
EB_ARGS="" EB_TIMEOUT_S=420 EB_GPU="" TUNED_GPU=1 MULTI_INSTANCES=2 MULTI_SECONDS=8
PROBE_BATCHES=1 PROBE_CONFIGS="default runner,default,unbatched" PROBE_BUSY_POLL_US="" CUDA_TIMING=1000 TUNE_MIN=3 SEQ_ARGS=()
THREADS_ARGS=""
STAGES=""
OPTIONS=" --budget-s --test-timeout-s --test-args --test-gpu --export-flags --extra-export --bench-args --eb-args \
--eb-timeout-s --eb-gpu --tuned-gpu --multi-instances --multi-seconds --probe-batches --probe-configs \
--probe-busy-poll-us --cuda-timing --tune-min --seq-args --threads-args "
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    --*) [[ $OPTIONS == *" $1 "* ]] || die "unknown option $1"
         [ $# -ge 2 ] || die "$1 needs a value"
         opt=$1 val=$2; shift 2 ;;
    -*) die "unknown option $1" ;;
    *) [[ " $ALL_STAGES " == *" $1 "* ]] || die "unknown stage '$1' (stages: $ALL_STAGES)"
       STAGES="$STAGES $1"; shift; continue ;;
  esac
  case $opt in
    --budget-s) whole "$opt" "$val"; BUDGET=$val ;;
    --test-timeout-s) whole "$opt" "$val"; TEST_TIMEOUT_S=$val ;;
    --test-args) TEST_ARGS=$val ;;
    --test-gpu) whole "$opt" "$val"; TEST_GPU=$val ;;
    --export-flags) EXPORT_FLAGS=$val ;;
    --extra-export) [[ $val =~ ^[A-Za-z0-9_]+=. ]] || die "--extra-export takes LABEL=FLAGS, got '$val'"
                    EXTRA_EXPORTS+=("$val") ;;
    --bench-args) BENCH_ARGS=$val ;;
    --eb-args) EB_ARGS=$val ;;
    --eb-timeout-s) whole "$opt" "$val"; EB_TIMEOUT_S=$val ;;
    --eb-gpu) whole "$opt" "$val"; EB_GPU=$val ;;
    --tuned-gpu) whole "$opt" "$val"; TUNED_GPU=$val ;;
    --multi-instances) wholes "$opt" "$val"; MULTI_INSTANCES=$val ;;
    --multi-seconds) whole "$opt" "$val"; MULTI_SECONDS=$val ;;
    --probe-batches) wholes "$opt" "$val"; PROBE_BATCHES=$val ;;
    --probe-configs) PROBE_CONFIGS=$val ;;
    --probe-busy-poll-us) whole "$opt" "$val"; PROBE_BUSY_POLL_US=$val ;;
    --cuda-timing) whole "$opt" "$val"; CUDA_TIMING=$val ;;
    --seq-args) SEQ_ARGS+=("$val") ;;
    --threads-args) THREADS_ARGS=$val ;;
    --tune-min) [[ $val =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--tune-min takes minutes, got '$val'"; TUNE_MIN=$val ;;
  esac
done
STAGES=${STAGES:-" deps build export test"}
# a choice left in the environment would be ignored without a word, and the run would not be the one asked for
stale=$(compgen -e | grep -E '^AOTC_(GPU|TEST|EB|EXPORT|EXTRA|BENCH|MULTI|PROBE|TUNED)_' | head -1)
[ -z "$stale" ] || die "$stale is set, but gpu.sh takes its choices as options, not from the environment"

cd "$ROOT"
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
START=$(date +%s)
DEPS=/tmp/aotc-deps          # unpacked .debs (never into /)
SITE=/tmp/aotc-site          # carried wheels
PKGS=/tmp/aotc-pkgs          # exported packages, shared by the tests and the benchmark
EXTRA=/tmp/aotc-pkgs-extra   # variants only the benchmark uses (freezing on, max-autotune)
BIN=/tmp/aotc-bin            # aotc, aotc-run, aotc-server on PATH
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/aotc-inductor-cache
# bench/ for bench/launch.py, which the tests share (pytest's pythonpath setting names it too)
export PYTHONPATH=$SITE:$ROOT/export:$ROOT/python_client:$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the carried gRPC and protobuf: .pc files and libraries for the build (their .pc files say prefix=/usr)
export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
export PATH=$BIN:$DEPS/usr/bin:$PATH
export AOTC_CUDA_PACKAGES=$PKGS
export AOTC_SERVER_BIN=$BIN/aotc-server   # for the tests (bench/launch.py); the build links it there
PY=$(command -v python3)

say() { echo "[gpu.sh +$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
# stage NAME LOG CMD...: runs CMD with its output in LOG (and on the console), records time and status.
stage() {
  local name=$1 log=$2; shift 2
  if ! want "$name"; then say "stage $name: skipped (not asked for)"; return 0; fi
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
  "$PY" -c "import fastapi, uvicorn, tritonclient.http, gevent; print('wheels import: ok')" || return 1
  "$PY" -c "import tritonclient.grpc; print('tritonclient.grpc: ok')" || echo "warning: tritonclient.grpc does not import"
  "$PY" -c "import tritonclient.utils.cuda_shared_memory as c; print('cuda-python: ok')" \
    || echo "warning: tritonclient.utils.cuda_shared_memory does not import (cuda-python): its tests skip"
  # perf_analyzer (.gpu/perf_analyzer.xz, from the perf-analyzer wheel): it dlopens libcudart.so for
  # --shared-memory cuda, which torch's wheel ships under another name only
  if [ -f .gpu/perf_analyzer.xz ]; then
    xz -dc .gpu/perf_analyzer.xz >"$BIN/perf_analyzer.bin" && chmod +x "$BIN/perf_analyzer.bin" || return 1
    local cudart
    cudart=$(find "$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')/nvidia" \
      -name 'libcudart.so*' 2>/dev/null | head -1)
    mkdir -p "$DEPS/cudart" && [ -n "$cudart" ] && ln -sf "$cudart" "$DEPS/cudart/libcudart.so"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
      "$DEPS/cudart" "$BIN/perf_analyzer.bin" >"$BIN/perf_analyzer" && chmod +x "$BIN/perf_analyzer"
    "$BIN/perf_analyzer" --version 2>&1 | head -1; echo "libcudart for perf_analyzer: ${cudart:-none found}"
  fi
}

# ---- build: aotc_runtime, aotc-run, aotc-server, aotc._runtime in build/gpu -----------------------------------
build() {
  local torch_prefix
  torch_prefix=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
  # gRPC only where its Debian packages came along in .deb/ (docs/gpu.md lists them): else aotc-server
  # is built without its gRPC endpoint (docs/server.md, gRPC).
  local grpc=OFF
  compgen -G ".deb/libgrpc++-dev_*.deb" >/dev/null && grpc=ON
  echo "gRPC endpoint: $grpc"
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DAOTC_BUILD_TESTS=OFF -DAOTC_GRPC=$grpc \
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
  ( aotc export models/mlp.py --device cuda --name mlp -o "$PKGS/mlp.pt2" $EXPORT_FLAGS >"$PKGS/mlp.log" 2>&1
    echo $? >"$PKGS/mlp.rc" ) &
  EXPORT_PIDS="$!"
  ( aotc export models/bert.py:bert_base --device cuda --dtype fp16 --name bert_base -o "$PKGS/bert_base.pt2" \
      $EXPORT_FLAGS >"$PKGS/bert_base.log" 2>&1
    echo $? >"$PKGS/bert_base.rc" ) &
  EXPORT_PIDS="$EXPORT_PIDS $!"
  ( aotc export models/embedding_answer.py --device cuda --dtype fp16 --name answer -o "$PKGS/answer.pt2" \
      $EXPORT_FLAGS >"$PKGS/answer.log" 2>&1
    echo $? >"$PKGS/answer.rc" ) &
  EXPORT_PIDS="$EXPORT_PIDS $!"
  EXPORTED="$PKGS/mlp $PKGS/bert_base $PKGS/answer"
  # --extra-export LABEL=FLAGS: more exports of bert_base for the benchmarks to compare
  local spec label flags
  for spec in ${EXTRA_EXPORTS[@]+"${EXTRA_EXPORTS[@]}"}; do
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
  aotc-server --model-repository "$repo" --http-port $port --grpc-port 0 &
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
  ( [ -n "$EB_GPU" ] && export CUDA_VISIBLE_DEVICES=$EB_GPU
    t0=$(date +%s); timeout "$EB_TIMEOUT_S" "$PY" bench/embedding_bag.py --device cuda \
      --json "$OUT/eb.json" $EB_ARGS >"$OUT/eb.log" 2>&1
    echo "exit $? in $(( $(date +%s) - t0 ))s" >>"$OUT/eb.log" ) &
  EB_PID=$!
fi
tuned() {
  export CUDA_VISIBLE_DEVICES=$TUNED_GPU
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
  say "stage tuned: started in the background on GPU $TUNED_GPU"
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
# ---- the stages that take turns, in the order they were named ---------------------------------------------
wait_eb() {
  [ -n "${EB_PID:-}" ] || return 0
  say "waiting for the embedding-bag benchmark"; wait "$EB_PID"; say "embedding-bag benchmark: $(tail -1 "$OUT/eb.log")"
  EB_PID=""
}
# multi: two GPUs, one server (the test file and the benchmark skip themselves below 2 GPUs)
multi() {
  "$PY" -m pytest -m cuda -q -p no:cacheprovider --timeout=120 -rs tests/test_server_instances.py || return 1
  local k
  for k in $MULTI_INSTANCES; do  # instances per GPU; each count is its own one-run comparison
    "$PY" bench/gpu_multi.py --packages "$PKGS" --instances "$k" --seconds "$MULTI_SECONDS" \
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
    --out "$OUT/gpu_bench.md" $args $BENCH_ARGS
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
# probe: where BERT's call time goes (AOTC_CUDA_TIMING, read by the C++ runtime: host and device phases of each
# replayed call, every --cuda-timing calls) in
# aotc-run, back to back and paced, and in aotc-server at concurrency 1 with one copy of the model loaded,
# then with three (the configs of stage phases), at each of --probe-batches, for each of --probe-configs.
probe() {
  make_ids
  local gap configs b
  for b in $PROBE_BATCHES; do
    for gap in 0 60 120 "120 --gap-spin" 200; do
      echo "== aotc-run --gap-us $gap, batch $b"
      AOTC_CUDA_TIMING=$CUDA_TIMING aotc-run "$PKGS/bert_base.pt2" /tmp/aotc-ids-b$b.npy --bench 3000 --warmup 300 \
        --gap-us $gap 2>&1 | grep -E '^bench:|cuda timing' | tail -3
    done
    for configs in $PROBE_CONFIGS; do
      echo "== aotc-server, configs $configs, batch $b, concurrency 1"
      AOTC_CUDA_TIMING=$CUDA_TIMING "$PY" bench/server_phases.py --package "$PKGS/bert_base.pt2" --batch $b \
        --configs $configs --rounds 2 --seconds 3 --server-log "$OUT/probe_server_${configs}_b$b.log" \
        --out "$OUT/probe_${configs}_b$b.md" || return 1
      grep "cuda timing" "$OUT/probe_server_${configs}_b$b.log" | tail -5
      if [ -n "$PROBE_BUSY_POLL_US" ]; then
        echo "== the same, aotc-server --busy-poll-us $PROBE_BUSY_POLL_US"
        AOTC_CUDA_TIMING=$CUDA_TIMING "$PY" bench/server_phases.py --package "$PKGS/bert_base.pt2" --batch $b \
          --configs $configs --rounds 2 --seconds 3 --busy-poll-us "$PROBE_BUSY_POLL_US" \
          --server-log "$OUT/probe_server_${configs}_b${b}_busy.log" --out "$OUT/probe_${configs}_b${b}_busy.md" || return 1
        grep "cuda timing" "$OUT/probe_server_${configs}_b${b}_busy.log" | tail -5
      fi
    done
  done
}
# batching: bench/batching.py, BERT batch-1 requests at concurrency 32, batched against unbatched, for the
# default package and each extra export of it (--extra-export), side by side in one server
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
# pa: Triton's perf_analyzer against aotc-server on BERT, HTTP and gRPC, concurrency 1 (bench/perf_analyzer.py)
pa() {
  local common="--package bert_base=$PKGS/bert_base.pt2 --perf-analyzer $BIN/perf_analyzer --server-flags= \
    --concurrency 1 --input-data zero --requests 500 --in-process"
  "$PY" bench/perf_analyzer.py $common --batch 8 --shm none,system,cuda --budget-s 150 --out "$OUT/pa_b8.md"
  local rc=$?
  "$PY" bench/perf_analyzer.py $common --package answer=$PKGS/answer.pt2 --batch 1 --shm none,system --rounds 2 \
    --aotc-load 3 --budget-s 180 --out "$OUT/pa_b1.md" || rc=$?
  return $rc
}
for s in $STAGES; do
  case $s in
    pa) wait_eb; stage pa "$OUT/pa.log" pa ;;
    beside) wait_eb; stage beside "$OUT/beside.log" "$PY" bench/beside.py --package "$PKGS/bert_base.pt2" \
              --beside answer="$PKGS/answer.pt2" --beside mlp="$PKGS/mlp.pt2" --beside bert_copy="$PKGS/bert_base.pt2" \
              --beside torch_graphs_1=torch-graphs:1 --beside torch_graphs_2=torch-graphs:2 \
              --calls 2000 --rounds 2 --out "$OUT/beside.md" ;;
    threads) wait_eb; stage threads "$OUT/threads.log" env AOTC_CUDA_TIMING=$CUDA_TIMING "$PY" bench/thread_cpu.py --package \
               bert_base="$PKGS/bert_base.pt2" --package answer="$PKGS/answer.pt2" --seconds 2 --rounds 3 \
               --server-flags= --server-flags="--busy-poll-us 200" --load-flags= --load-flags=--busy-poll \
               --in-process $THREADS_ARGS --out "$OUT/threads.md" ;;
    tune) wait_eb; stage tune "$OUT/tune.log" "$PY" bench/tune_targets.py --model models/bert.py:bert_base \
            --device cuda --dtype fp16 --concurrency 32 --budget-min "$TUNE_MIN" \
            --variants default,no-static-batches --out "$OUT/tune.md" ;;
    loopback) wait_eb; stage loopback "$OUT/loopback.log" "$PY" bench/loopback.py --seconds 2 --rounds 3 \
                --out "$OUT/loopback.md" ;;
    warmup) wait_eb; stage warmup "$OUT/warmup.log" "$PY" bench/warmup.py --package "$PKGS/bert_base.pt2" \
              --batches 1,2,4,8,16,32 --clients 16 --seconds 3 --rounds 3 --out "$OUT/warmup.md" ;;
    memory) wait_eb; stage memory "$OUT/memory.log" memory ;;
    seqbench) wait_eb; [ ${#SEQ_ARGS[@]} -gt 0 ] || SEQ_ARGS=("")
              n=0; for a in "${SEQ_ARGS[@]}"; do n=$((n + 1)); sfx=$( [ $n = 1 ] || echo "_$n" )
                stage seqbench "$OUT/seq_buckets$sfx.log" "$PY" bench/seq_buckets.py --device cuda \
                  --dtype fp16 --export-arg=--static-batches=none --runners 2 --seconds 8 --rounds 2 \
                  --pkg-dir /tmp/aotc-seq --out "$OUT/seq_buckets$sfx.md" $a; done ;;
    phases) wait_eb; stage phases "$OUT/phases.log" phases ;;
    pacing) wait_eb; stage pacing "$OUT/pacing.log" pacing ;;
    probe) wait_eb; stage probe "$OUT/probe.log" probe ;;
    batching) wait_eb; stage batching "$OUT/batching.log" batching ;;
    check) stage check "$OUT/export.log" check_packages ;;
    test)
      [ -z "$EB_GPU" ] && wait_eb  # without a GPU of its own, the benchmark must not share one
      stage test "$OUT/pytest.log" env ${TEST_GPU:+CUDA_VISIBLE_DEVICES=$TEST_GPU} \
        timeout "$TEST_TIMEOUT_S" "$PY" -m pytest -m cuda -q -p no:cacheprovider --timeout=120 -rs \
        $TEST_ARGS ;;
    multi) wait_eb; stage multi "$OUT/multi.log" multi ;;
    bench) [ -z "$EB_GPU" ] && wait_eb; stage bench "$OUT/bench.log" bench ;;
  esac
done
wait_eb
if [ -n "${TUNED_PID:-}" ]; then
  say "waiting for stage tuned"; wait "$TUNED_PID"; say "stage tuned: $(tail -1 "$OUT/tuned.log")"
fi
say "done in $(( $(date +%s) - START ))s"
