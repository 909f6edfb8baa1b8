#!/usr/bin/env bash
# make demo: export the example models into a model repository, serve it with aotc-server (C++), and check
# over HTTP that what the server answers is what eager PyTorch computes. Exported packages are reused when
# the model file and the exporter are unchanged (their keys are in .cache/demo/).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
REPO=.cache/demo/repository
PORT=${AOTC_DEMO_PORT:-8765}
mkdir -p "$REPO"

export_model() {  # export_model NAME SPEC: export once per (model file, exporter source) into the repository
  local name=$1 spec=$2 file=${2%%:*}
  local key; key=$(cat "$file" export/aotc/*.py export/aotc/rewrite/*.py | sha256sum | cut -c1-16)
  local out=$REPO/$name/1/model.pt2
  if [ -f "$out" ] && [ "$(cat "$REPO/$name/.key" 2>/dev/null)" = "$key" ]; then
    echo "== $name: package is up to date ($out)"
    $BIN/aotc inspect "$out" | head -n 12
  else
    echo "== aotc export $spec"
    mkdir -p "$(dirname "$out")"
    $BIN/aotc export "$spec" --name "$name" -o "$out"
    echo "$key" > "$REPO/$name/.key"
  fi
}

export_model mlp models/mlp.py
export_model embedding_bag models/embedding_bag.py
export_model simple models/simple.py

echo "== aotc-run self-check (C++, no Python)"
env -i "$BIN/aotc-run" "$REPO/mlp/1/model.pt2"

echo "== aotc-server on 127.0.0.1:$PORT"
$BIN/aotc-server --model-repository "$REPO" --http-port "$PORT" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do
  curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "aotc-server exited before it was ready" >&2; exit 1; }
  sleep 0.1
done
curl -s "http://127.0.0.1:$PORT/v2/models/mlp"; echo

echo "== parity over HTTP against eager PyTorch"
$BIN/aotc check --url "127.0.0.1:$PORT" models/mlp.py --name mlp
$BIN/aotc check --url "127.0.0.1:$PORT" models/embedding_bag.py --name embedding_bag
$BIN/aotc check --url "127.0.0.1:$PORT" models/simple.py --name simple

echo "== a short load test (binary tensors, concurrency 1 and 8, 3 s each)"
$BIN/aotc bench --url "127.0.0.1:$PORT" --model mlp --concurrency 1,8 --duration 3
echo "demo finished"
