"""The floor of an answer of N bytes on this host: aotc-load's own loopback responder (a process of its own; no
server, no model) answering on one keep-alive connection, for several N: over HTTP a GET, with the kernel's
socket buffer autotuning and with fixed SO_SNDBUF/SO_RCVBUF; over gRPC (--transports http,grpc) a unary call
with an empty message to one raw method on a completion queue, as aotc-server serves ModelInfer. With
--spin-us the responder spins that long before each answer, standing for a model call on the serving thread
(aotc-server's spins in the CUDA runtime's wait while the model runs on the GPU). The settings take turns for
--rounds rounds and each cell is the median of its rounds' p50s; a second table gives the CPU time per
request of aotc-load and of the responder. What aotc-server adds over an in-process call
(which moves no bytes through a socket) for an answer of N bytes cannot be below the row for N, short of the
responder's own few microseconds; over gRPC, the floor is what gRPC's library itself costs on this host.
Prints a markdown table per spin and writes them to --out.
  python bench/loopback.py [--sizes 0 65536 ...] [--socket-buffers 0 4194304] [--transports http]
      [--spin-us 0 ...] [--load-flags "--busy-poll"] [--seconds 2] [--rounds 3]
aotc-load: as bench/launch.py's find_binary looks for it. Not a test; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
from pathlib import Path

from loadgen import loopback_load

# 0: the request alone; BERT-base fp16 seq 128 answers 196 KiB a row: batch 1 and 8 (with the pooler output)
DEFAULT_SIZES = [0, 65536, 198656, 1581056, 4194304]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="answer sizes in bytes")
    ap.add_argument("--socket-buffers", type=int, nargs="+", default=[0, 4 << 20],
                    help="SO_SNDBUF/SO_RCVBUF of both ends in bytes; 0 = the kernel's autotuning")
    ap.add_argument("--transports", default="http", help="comma-separated, of http and grpc (default http)")
    ap.add_argument("--spin-us", type=int, nargs="+", default=[0],
                    help="microseconds the responder spins before each answer; a table each")
    ap.add_argument("--load-flags", default="", help="more of aotc-load's flags for every cell (--busy-poll)")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per cell and round (after a 1 s warm-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("loopback.md"))
    args = ap.parse_args()
    transports = args.transports.split(",")
    if not transports or any(t not in ("http", "grpc") for t in transports):
        ap.error(f"--transports is '{args.transports}', expected a comma-separated list of http and grpc")
    if any(us < 0 for us in args.spin_us):
        ap.error("--spin-us takes microseconds >= 0")
    # the columns: HTTP with each socket buffer setting, gRPC with the kernel's autotuning (gRPC sets its own)
    columns = [(t, buf) for t in transports for buf in (args.socket_buffers if t == "http" else [0])]

    p50: dict[tuple, list[float]] = {}
    cpu: dict[tuple, list[tuple[float, float]]] = {}  # (aotc-load's, the responder's) CPU us per request
    for _ in range(args.rounds):
        for spin in args.spin_us:
            for size in args.sizes:
                for t, buf in columns:
                    r = loopback_load(size, args.seconds, buf, grpc=t == "grpc", spin_us=spin,
                                      load_flags=shlex.split(args.load_flags))
                    p50.setdefault((spin, size, t, buf), []).append(r["p50_ms"] * 1e3)
                    cpu.setdefault((spin, size, t, buf), []).append((r["cpu_us"], r["responder_cpu_us"]))

    def label(t: str, buf: int) -> str:
        return f"{t.upper() if t == 'http' else 'gRPC'} " + ("autotuned" if buf == 0 else f"{buf >> 10} KiB buffers")

    lines = [f"Loopback floor of an answer, {platform.node()} ({os.cpu_count()} CPUs), {args.rounds} rounds of "
             f"{args.seconds:g} s per cell{', aotc-load ' + args.load_flags if args.load_flags else ''}: p50 us of "
             f"a request answered with N bytes by aotc-load's own responder (median of the rounds' p50s), and in "
             f"brackets the difference to the {args.sizes[0]}-byte answer."]
    def table(title: str, cell) -> list[str]:  # a row per size, a column per setting; cell(size, column)
        return ["", title, "", "| answer bytes | " + " | ".join(label(*c) for c in columns) + " |",
                "|---|" + "---|" * len(columns),
                *(f"| {size} | " + " | ".join(cell(size, c) for c in columns) + " |" for size in args.sizes)]

    for spin in args.spin_us:
        med = {(size, c): statistics.median(p50[(spin, size, *c)]) for size in args.sizes for c in columns}
        lines += table(f"The responder spins {spin} us before each answer:" if spin else "No spin:",
                       lambda size, c: f"{med[size, c]:.1f} (+{med[size, c] - med[args.sizes[0], c]:.1f})")
        lines += table("CPU us per request (user + system, the warm-up's requests included), aotc-load / the "
                       "responder:", lambda size, c: " / ".join(
                           f"{statistics.median(x[i] for x in cpu[(spin, size, *c)]):.1f}" for i in (0, 1)))
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
