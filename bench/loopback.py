"""The floor of an HTTP answer of N bytes on this host: aotc-load's own loopback responder (no server, no
model) answering a GET with N bytes on one keep-alive connection, for several N, with the kernel's socket
buffer autotuning and with fixed SO_SNDBUF/SO_RCVBUF; the settings take turns for --rounds rounds and each cell
is the median of its rounds' p50s. What aotc-server adds over an in-process call (which moves no bytes
through a socket) for an answer of N bytes cannot be below the row for N, short of the responder's own few
microseconds. Prints a markdown table and writes it to --out.
  python bench/loopback.py [--sizes 0 65536 ...] [--socket-buffers 0 4194304] [--seconds 2] [--rounds 3]
aotc-load: as bench/launch.py's find_binary looks for it. Not a test; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per cell and round (after a 1 s warm-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("loopback.md"))
    args = ap.parse_args()

    p50: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.rounds):
        for size in args.sizes:
            for buf in args.socket_buffers:
                p50.setdefault((size, buf), []).append(loopback_load(size, args.seconds, buf)["p50_ms"] * 1e3)

    def label(buf: int) -> str:
        return "autotuned" if buf == 0 else f"{buf >> 10} KiB buffers"

    base = {buf: statistics.median(p50[(args.sizes[0], buf)]) for buf in args.socket_buffers}
    lines = [f"Loopback floor of an answer, {platform.node()} ({os.cpu_count()} CPUs), {args.rounds} rounds of "
             f"{args.seconds:g} s per cell: p50 us of a GET answered with N bytes by aotc-load's own responder "
             f"(median of the rounds' p50s), and in brackets the difference to the {args.sizes[0]}-byte answer.", "",
             "| answer bytes | " + " | ".join(label(b) for b in args.socket_buffers) + " |",
             "|---|" + "---|" * len(args.socket_buffers)]
    for size in args.sizes:
        cells = []
        for buf in args.socket_buffers:
            m = statistics.median(p50[(size, buf)])
            cells.append(f"{m:.1f} (+{m - base[buf]:.1f})")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
