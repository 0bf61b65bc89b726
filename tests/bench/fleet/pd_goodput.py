#!/usr/bin/env python3
"""Goodput at a TTFT and an ITL SLO from `kvfleet bench --requests-out` files (pd_compare.sh).

  pd_goodput.py [--ttft-slo-ms 1000] [--itl-slo-ms 20] FILE.requests.jsonl...

A request meets the SLOs when it completed, its TTFT is within --ttft-slo-ms and its mean
inter-token gap (TPOT) within --itl-slo-ms. Goodput is such requests per second of the
replayed window (first to last send). Prints one row per file: requests, TTFT p50/p99, the
mean gap's p50/p99 and the longest gap's p99 over requests, each SLO's share and goodput.
"""
import argparse
import json
import os


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ttft-slo-ms", type=float, default=1000)
    ap.add_argument("--itl-slo-ms", type=float, default=20)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    print(f"SLOs: TTFT <= {a.ttft_slo_ms:g} ms, mean inter-token gap (TPOT) <= {a.itl_slo_ms:g} ms")
    print(f"{'run':28} {'reqs':>5} {'ok':>5} {'ttft_p50':>8} {'ttft_p99':>8} {'tpot_p50':>8} {'tpot_p99':>8} "
          f"{'gapmax_p99':>10} {'ttft_ok':>7} {'itl_ok':>6} {'both_ok':>7} {'goodput':>8}")
    for path in a.files:
        rows = [json.loads(line) for line in open(path) if line.strip()]
        ok = [r for r in rows if r.get("ok")]
        ttft = [r["ttft_s"] * 1e3 for r in ok]
        tpot = [r["itl_mean_s"] * 1e3 for r in ok if "itl_mean_s" in r]
        gapmax = [r["itl_max_s"] * 1e3 for r in ok if "itl_max_s" in r]
        t_ok = [r for r in ok if r["ttft_s"] * 1e3 <= a.ttft_slo_ms]
        i_ok = [r for r in ok if r.get("itl_mean_s", 0) * 1e3 <= a.itl_slo_ms]
        both = [r for r in t_ok if r.get("itl_mean_s", 0) * 1e3 <= a.itl_slo_ms]
        sent = [r["sent_unix_s"] for r in rows if r.get("sent_unix_s")]
        window = max(sent) - min(sent) if len(sent) > 1 else 0
        name = os.path.basename(path).replace(".requests.jsonl", "")
        n = max(1, len(rows))
        print(f"{name:28} {len(rows):5d} {len(ok):5d} {pct(ttft, 50):8.1f} {pct(ttft, 99):8.1f} {pct(tpot, 50):8.2f} "
              f"{pct(tpot, 99):8.2f} {pct(gapmax, 99):10.1f} {len(t_ok) / n:7.3f} {len(i_ok) / n:6.3f} "
              f"{len(both) / n:7.3f} {len(both) / window if window > 0 else float('nan'):8.2f}")


if __name__ == "__main__":
    main()
