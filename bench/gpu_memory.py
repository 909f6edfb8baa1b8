"""What a package costs on disk and on the GPU: for each LABEL=PACKAGE, its size, its graphs, and the device
memory one aotc.runtime.Session takes once loaded (free memory before and after, torch.cuda.mem_get_info),
each package in a fresh process so one's memory does not hide another's. Prints a markdown table.
  python bench/gpu_memory.py default=PKG buckets=PKG2 [--out FILE]
Not a test; asserts nothing. Needs a CUDA device and the aotc._runtime module.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Runs in the child: one Session, then the device memory it holds, as one JSON line.
_CHILD = """
import json, sys, torch
from aotc.runtime import Session
torch.cuda.init()
free0, _ = torch.cuda.mem_get_info()
s = Session(sys.argv[1])
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
print(json.dumps({"device_mb": (free0 - free1) / 2**20, "graphs": 1 + len(s.manifest.static_graphs),
                  "lent": sum(1 for g in s.manifest.static_graphs if g.weights)}))
"""


def measure(path: Path) -> dict:
    # the child imports aotc as this process does (installed, or on PYTHONPATH as bench/gpu.sh sets it)
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("packages", nargs="+", help="LABEL=PACKAGE")
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = ["| package | size on disk MB | graphs | of them on lent weights | device memory at load MB |",
             "|---|---|---|---|---|"]
    for spec in args.packages:
        label, _, path = spec.partition("=")
        m = measure(Path(path))
        size = os.path.getsize(path) / 1e6
        if "error" in m:
            lines.append(f"| {label} | {size:.0f} | - | - | failed: {m['error']} |")
        else:
            lines.append(f"| {label} | {size:.0f} | {m['graphs']} | {m['lent']} | {m['device_mb']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
