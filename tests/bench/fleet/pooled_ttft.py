#!/usr/bin/env python3
"""Pools the TTFT of several rounds of a fleet comparison, per row and policy.

  pooled_ttft.py OUT_DIR [OUT_DIR ...]

Each OUT_DIR is one round of tests/bench/fleet/transfer_compare.sh (or any directory of
`kvfleet bench --out` JSON files). A row is a JSON file's name, with "-nopull" and the like
read as a policy suffix: `mooncake-1.3x-nopull.json`'s kv run is policy "kv-nopull" of row
"mooncake-1.3x". Every run's TTFT CDF (`ttft_cdf_ms`) joins its row and policy's pool, and the
pool's mean and quantiles are printed beside the range of the runs' own p99s and cached ratios
(over the ideal). A CDF point stands for the requests its cumulative fraction adds (the bench
keeps at most 2,000 points a run, evenly spaced in rank, and repeats the slowest at 1.0, which
adds none), and quantiles are the bench's own: linear between the two nearest ranks. A pool of
one run whose CDF is not thinned gives that run's mean and p99.

One run's p99 over ~1,500 requests rests on its 15 slowest; rounds differ by several percent.
The pool ranks policies on the same question with every round's requests at once.
"""
import glob
import json
import os
import sys


def runs_of(out_dirs):
    pools = {}
    for d in out_dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            name = os.path.basename(path)[: -len(".json")]
            row = name.partition("-nopull")[0]
            try:
                runs = json.load(open(path))["runs"]
            except (ValueError, KeyError) as e:
                sys.exit(f"{path}: not a kvfleet bench --out file ({e})")
            for run in runs:
                policy = run["policy"] + ("-nopull" if name != row else "")
                pools.setdefault(row, {}).setdefault(policy, []).append(run)
    return pools


def samples(run):
    """The run's TTFTs as its CDF gives them: each point repeated for the requests it stands for."""
    count = run["ttft_ms"]["count"]
    out, seen = [], 0
    for value, fraction in run["ttft_cdf_ms"]:
        upto = round(fraction * count)
        out.extend([value] * (upto - seen))
        seen = max(seen, upto)
    return out


def quantile(values, q):
    """As the bench's Percentile: linear between the ranks around q x (n - 1) of sorted values."""
    rank = q * (len(values) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pools = runs_of(sys.argv[1:])
    if not pools:
        sys.exit("no bench JSON files under " + " ".join(sys.argv[1:]))
    for row in sorted(pools):
        print(f"== {row}")
        print(f"  {'policy':12s} {'runs':>4s} {'mean':>8s} {'p90':>8s} {'p99':>8s} {'p99.5':>8s}   "
              f"{'runs p99':>17s}  cached/ideal")
        for policy in sorted(pools[row]):
            runs = pools[row][policy]
            ttft = sorted(v for run in runs for v in samples(run))
            if not ttft:
                continue
            p99s = [run["ttft_ms"]["p99"] for run in runs]
            cached = [run["cached_token_ratio"] / run["ideal_cached_token_ratio"]
                      for run in runs if run.get("ideal_cached_token_ratio")]
            cached_text = f"{min(cached):.3f}-{max(cached):.3f}" if cached else "-"
            print(f"  {policy:12s} {len(runs):4d} {sum(ttft) / len(ttft):8.1f} {quantile(ttft, 0.9):8.1f} "
                  f"{quantile(ttft, 0.99):8.1f} {quantile(ttft, 0.995):8.1f}   "
                  f"{min(p99s):8.1f}-{max(p99s):8.1f}  {cached_text}")
    print("(ms; pooled over every run's TTFT CDF; runs p99: the range of the runs' own p99s)")


if __name__ == "__main__":
    main()
