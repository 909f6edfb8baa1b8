"""What `aotc tune` writes (aotc/tune.py measures): the table, the Pareto plot (SVG, written by hand: no plotting
library), tune.json, and the winner as a repository entry with the command that serves it. Pure functions of
the measurements but for the files written; single-threaded."""

from __future__ import annotations

import json
import math
import os
import shutil


def summary(result: dict) -> tuple[float, float]:
    """(mean throughput over the concurrencies, worst p99) of one candidate's measurements."""
    per = list(result["per_concurrency"].values())
    return sum(r["req_per_s"] for r in per) / len(per), max(r["p99_ms"] for r in per)


def meets(result: dict, budget_ms: float) -> bool:
    return all(r["p99_ms"] < budget_ms and r["errors"] == 0 for r in result["per_concurrency"].values())


def score(result: dict, budget_ms: float) -> tuple:
    """Orders candidates: those within the budget at every concurrency (no errors) by mean throughput, then
    the others by their worst p99."""
    tput, p99 = summary(result)
    return (1, tput) if meets(result, budget_ms) else (0, -p99)


def table_lines(rows: list, concurrency, budget_ms: float) -> list[str]:
    """A markdown table, one row per (candidate, result), best first."""
    head = "| configuration | round | " + " | ".join(f"c={n} req/s | c={n} p50 ms | c={n} p99 ms" for n in concurrency)
    lines = [head + f" | p99 < {budget_ms:g} ms |", "|" + "---|" * (3 + 3 * len(concurrency))]
    for c, r in rows:
        cells = " | ".join(f"{r['per_concurrency'][n]['req_per_s']:.1f} | {r['per_concurrency'][n]['p50_ms']:.2f} | "
                           f"{r['per_concurrency'][n]['p99_ms']:.2f}" for n in concurrency)
        lines.append(f"| {c.label} | {r['round']} | {cells} | {'yes' if meets(r, budget_ms) else 'no'} |")
    return lines


def pareto_svg(points: list[tuple[str, float, float]], budget_ms: float, winner: str | None, default: str | None) -> str:
    """Throughput (y) against worst p99 (x, ms) of every candidate [(label, p99, req/s)], the Pareto front (no
    other point has both a lower p99 and a higher throughput) joined, the budget as a vertical line."""
    pts = [(lbl, x, y) for lbl, x, y in points if math.isfinite(x)]
    if not pts:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="640" height="60"><text x="10" y="30">no measurement</text></svg>'
    w, h, m = 720, 440, 60
    xmax = max(max(x for _, x, _ in pts), budget_ms) * 1.1
    ymax = max(y for _, _, y in pts) * 1.1 or 1
    sx = lambda x: m + x / xmax * (w - 2 * m)  # noqa: E731
    sy = lambda y: h - m - y / ymax * (h - 2 * m)  # noqa: E731
    front = sorted((p for p in pts if not any(q[1] <= p[1] and q[2] > p[2] or q[1] < p[1] and q[2] >= p[2]
                                              for q in pts)), key=lambda p: p[1])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 20}" text-anchor="middle">p99 latency, ms (worst over the concurrencies)</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">throughput, req/s</text>',
           f'<text x="{m}" y="{h - m + 15}">0</text><text x="{w - m}" y="{h - m + 15}" text-anchor="end">{xmax:.3g}</text>',
           f'<text x="{m - 5}" y="{m}" text-anchor="end">{ymax:.3g}</text>',
           f'<line x1="{sx(budget_ms):.1f}" y1="{m}" x2="{sx(budget_ms):.1f}" y2="{h - m}" stroke="red" '
           f'stroke-dasharray="6,4"/><text x="{sx(budget_ms) + 4:.1f}" y="{m + 12}" fill="red">budget {budget_ms:g} ms</text>']
    if len(front) > 1:
        out.append('<polyline fill="none" stroke="steelblue" points="' +
                   " ".join(f"{sx(x):.1f},{sy(y):.1f}" for _, x, y in front) + '"/>')
    for lbl, x, y in pts:
        color = "green" if lbl == winner else "orange" if lbl == default else "steelblue"
        r = 6 if lbl in (winner, default) else 3
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{r}" fill="{color}"><title>{_esc(lbl)}: '
                   f'{y:.1f} req/s, p99 {x:.2f} ms</title></circle>')
    for lbl, color, dy in ((winner, "green", 0), (default, "orange", 16)):
        if lbl:
            out.append(f'<text x="{w - m}" y="{m + dy}" text-anchor="end" fill="{color}">{_esc(lbl)}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_outputs(o, cands, results: dict, dropped: dict, pkgs: dict, say, elapsed_s: float) -> int:
    """tune.md, tune.json, tune_pareto.svg and (when a configuration met the budget) the winner's entry under
    o.out. Returns 0 with a winner, 1 without."""
    from aotc import manifest as manifest_mod

    measured = [(c, results[c]) for c in cands if c in results]
    last = max(r["round"] for _, r in measured)
    key = lambda cr: score(cr[1], o.p99_ms)  # noqa: E731
    # the winner among the candidates measured longest (the last round), whose numbers are the surest
    finalists = sorted((cr for cr in measured if cr[1]["round"] == last), key=key, reverse=True)
    rows = sorted(measured, key=lambda cr: (cr[1]["round"], key(cr)), reverse=True)
    best, best_r = finalists[0]
    default = next(((c, r) for c, r in measured if c.variant == "default" and c.max_batch_size is None), None)
    ok = meets(best_r, o.p99_ms)
    lines = [f"# aotc tune {o.spec}", "",
             f"Budget p99 < {o.p99_ms:g} ms at concurrency {','.join(map(str, o.concurrency))}, request batch "
             f"{o.request_batch}, device {o.device} ({o.dtype}); {len(measured)} of {len(cands)} candidates "
             f"measured in {last} round(s), {elapsed_s / 60:.1f} min.", ""]
    if dropped:
        lines += ["Dropped export variants:"] + [f"- {k}: {v}" for k, v in dropped.items()] + [""]
    name = manifest_mod.read(pkgs[best.variant]).name
    if ok:
        entry = os.path.join(o.out, name)
        shutil.rmtree(entry, ignore_errors=True)
        os.makedirs(os.path.join(entry, "1"))
        shutil.copyfile(pkgs[best.variant], os.path.join(entry, "1", "model.pt2"))
        if best.config() is not None:
            with open(os.path.join(entry, "config.json"), "w") as f:
                json.dump(best.config(), f, indent=2)
        tput, p99 = summary(best_r)
        serve = " ".join(["aotc serve", o.out, *best.server_flags()])
        told = [f"winner: {best.label}: {tput:.1f} req/s, p99 {p99:.2f} ms; serve it with `{serve}`"]
        if default is not None:
            d_tput, d_p99 = summary(default[1])
            within = "within" if meets(default[1], o.p99_ms) else "NOT within"
            told.append(f"default ({default[0].label}): {d_tput:.1f} req/s, p99 {d_p99:.2f} ms ({within} the "
                        f"budget); the winner has {tput / d_tput:.2f}x its throughput" if d_tput else
                        f"default ({default[0].label}): no answer")
        lines += [f"- {t}" for t in told] + [""]
        for t in told:
            say(t)
    else:
        p99 = summary(best_r)[1]
        lines += [f"**No configuration met p99 < {o.p99_ms:g} ms.** The best p99 reached was {p99:.2f} ms, with "
                  f"{best.label}.", ""]
        say(f"no configuration met p99 < {o.p99_ms:g} ms; the best p99 reached was {p99:.2f} ms, with {best.label}")
    lines += table_lines(rows, o.concurrency, o.p99_ms)
    with open(os.path.join(o.out, "tune.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(o.out, "tune.json"), "w") as f:
        json.dump({"budget_ms": o.p99_ms, "concurrency": list(o.concurrency), "winner": best.label if ok else None,
                   "dropped": dropped, "candidates": [{"label": c.label, "variant": c.variant, "config": c.config(),
                                                       "server_flags": c.server_flags(), **r} for c, r in rows]},
                  f, indent=1, default=lambda v: None)
    points = [(c.label, summary(r)[1], summary(r)[0]) for c, r in measured]
    with open(os.path.join(o.out, "tune_pareto.svg"), "w") as f:
        f.write(pareto_svg(points, o.p99_ms, best.label if ok else None, default[0].label if default else None))
    say(f"wrote {os.path.join(o.out, 'tune.md')}, tune.json, tune_pareto.svg" + (f", {name}/ (the winner)" if ok else ""))
    return 0 if ok else 1


def add_served(o, command: str, winner: dict, per: dict, say, tolerance: float = 0.15) -> None:
    """Adds what `command` (aotc serve of the written entry) served, `per` concurrency, beside the winner's
    measured numbers to tune.md and tune.json ("served"): reproduced when its throughput is within `tolerance`
    of the measured one at every concurrency."""
    served = {"per_concurrency": per}
    tput, p99 = summary(served)
    measured = summary(winner)[0]
    ratio = tput / measured if measured else 0.0
    reproduced = all(abs(per[n]["req_per_s"] / winner["per_concurrency"][n]["req_per_s"] - 1) <= tolerance
                     if winner["per_concurrency"][n]["req_per_s"] else False for n in per)
    line = (f"`{command}` served {tput:.1f} req/s, p99 {p99:.2f} ms: {ratio:.2f}x the throughput measured in the "
            f"search ({'reproduced' if reproduced else 'NOT reproduced'} within {tolerance:.0%} at every "
            f"concurrency)")
    say(line)
    md = os.path.join(o.out, "tune.md")
    with open(md) as f:
        text = f.read()
    head, sep, rest = text.partition("\n\n| configuration")  # the table comes last: the line goes before it
    with open(md, "w") as f:
        f.write(head + f"\n- {line}" + sep + rest)
    path = os.path.join(o.out, "tune.json")
    with open(path) as f:
        info = json.load(f)
    info["served"] = {"command": command, "per_concurrency": per, "ratio": ratio, "reproduced": reproduced}
    with open(path, "w") as f:
        json.dump(info, f, indent=1, default=lambda v: None)
