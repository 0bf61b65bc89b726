#!/usr/bin/env python3
"""Joins a router's decision log to a bench's request lines: where the kv estimate erred, and
what the slowest first tokens were waiting for.

  decision_errors.py --requests R.jsonl --decisions D.jsonl [--policy kv] [--tail 0.01] [--late 6]

R is `kvfleet bench --requests-out`, D the router's `--decision-log` of the same run (one router).
Each request is joined to the decision that names its id (the bench sends each request with an
X-Request-Id, which the router logs); files from before the ids, to the decision with its
prompt's token count made closest to its send time (the clocks' offset from the first requests). Prints:
  - by the chosen worker's queue ahead (queued prefill / its rate, before calibration), the
    error of the estimated first token (actual - estimated): mean, p10, p90;
  - the same for requests that pulled their prefix and for the rest;
  - the TTFT's p90/p99/p99.5 beside those of each request's own uncached prefill at the chosen
    worker's rate (the floor no choice of worker gets under, at the cache reuse achieved), and
    how many of the slowest `--tail` were sent where the estimate was over 50 ms later than at
    the soonest candidate;
  - the slowest `--tail` of the requests: the estimate, the prompt and its cached tokens, the
    chosen worker's queue and own prefill, and the soonest other candidate's estimate;
  - the `--late` requests whose first token came latest after its estimate, each with the
    requests sent to the same worker from 1.5 s before it to its first token (what it waited for).
"""
import argparse
import json
import statistics


def load(path, policy):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in rows if policy is None or r.get("policy") == policy]


def join(requests, decisions):
    """(request, decision) pairs: by the request's id (X-Request-Id, which the router logs) where
    both have one, else matched by prompt tokens and send time."""
    by_id = {d["request_id"]: d for d in decisions if d.get("request_id")}
    if by_id and all(r.get("request_id") for r in requests):
        return [(r, by_id[r["request_id"]]) for r in requests if r["request_id"] in by_id]
    offsets = []
    for r in requests[:200]:
        for d in decisions[:400]:
            guess = statistics.median(offsets) if offsets else d["t_s"] - r["sent_unix_s"]
            if d["prompt_tokens"] == r["prompt_tokens"] and abs(d["t_s"] - r["sent_unix_s"] - guess) < 0.05:
                offsets.append(d["t_s"] - r["sent_unix_s"])
                break
    if not offsets:
        raise SystemExit("no request matched a decision: are the two files of the same run and policy?")
    offset = statistics.median(offsets)
    by_tokens = {}
    for i, d in enumerate(decisions):
        by_tokens.setdefault(d["prompt_tokens"], []).append(i)
    used, pairs = set(), []
    for r in requests:
        best = None
        for i in by_tokens.get(r["prompt_tokens"], []):
            gap = abs(decisions[i]["t_s"] - offset - r["sent_unix_s"])
            if i not in used and gap < 0.2 and (best is None or gap < best[0]):
                best = (gap, i)
        if best is not None:
            used.add(best[1])
            pairs.append((r, decisions[best[1]]))
    return pairs


def chosen(d):
    return next(c for c in d["candidates"] if c["worker"] == d["worker"] and
                (c.get("pull_blocks", 0) > 0) == (d["pull_blocks"] > 0))


def rate(c, d):
    """The candidate's prefill rate, else the fleet's (approx reads no reports)."""
    return c["prefill_tokens_per_s"] if c["prefill_tokens_per_s"] > 0 else max(d["fleet_rate"], 1.0)


def queue_s(c, d):
    return c["queued_prefill_tokens"] / rate(c, d)


def summary(label, errors):
    if not errors:
        return
    e = sorted(errors)
    print(f"  {label:24s} n {len(e):5d}  error mean {1e3 * statistics.mean(e):7.1f} ms"
          f"  p10 {1e3 * e[len(e) // 10]:7.1f}  p90 {1e3 * e[9 * len(e) // 10]:7.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--decisions", required=True)
    ap.add_argument("--policy", default="kv")
    ap.add_argument("--tail", type=float, default=0.01)
    ap.add_argument("--late", type=int, default=6)
    a = ap.parse_args()
    requests = [r for r in load(a.requests, a.policy) if r.get("ok")]
    pairs = join(requests, load(a.decisions, a.policy))
    whole = [(r, d) for r, d in pairs if not d.get("split")]
    print(f"{a.policy}: {len(requests)} requests, {len(pairs)} joined to a decision")
    if not whole:
        return
    print("estimate error (actual - estimated first token) by the chosen worker's queue ahead:")
    bins = [0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, float("inf")]
    for lo, hi in zip(bins, bins[1:]):
        summary(f"queue {lo:.2f}-{hi:.2f} s", [r["ttft_s"] - d["estimated_ttft_s"] for r, d in whole
                                               if d["pull_blocks"] == 0 and lo <= queue_s(chosen(d), d) < hi])
    summary("pulled a prefix", [r["ttft_s"] - d["estimated_ttft_s"] for r, d in whole if d["pull_blocks"] > 0])
    summary("the rest", [r["ttft_s"] - d["estimated_ttft_s"] for r, d in whole if d["pull_blocks"] == 0])

    slowest = sorted(whole, key=lambda p: -p[0]["ttft_s"])[:max(1, int(a.tail * len(whole)))]
    ttft = sorted(r["ttft_s"] for r, _ in whole)
    own = sorted((r["prompt_tokens"] - r["cached_tokens"]) / rate(chosen(d), d) for r, d in whole)
    print("TTFT against its floor, the own prefill without a queue (ms):")
    for q in (0.9, 0.99, 0.995):
        print(f"  p{100 * q:<5g} TTFT {1e3 * ttft[int(q * len(ttft))]:6.0f}  own prefill {1e3 * own[int(q * len(own))]:6.0f}")
    later = sum(1 for _, d in slowest if chosen(d)["ttft_s"] > min(c["ttft_s"] for c in d["candidates"]) + 0.05)
    print(f"  of the slowest {len(slowest)}, {later} were sent where the estimate was over 50 ms later than the soonest")
    print(f"the slowest {len(slowest)} (ms; queue and own at the chosen worker's rate; soonest: another candidate):")
    print("   ttft    est  prompt  cached  worker  queue   own  soonest (worker)  pulled")
    for r, d in slowest:
        c = chosen(d)
        r_c = rate(c, d)
        others = [x for x in d["candidates"] if x["worker"] != d["worker"]]
        soon = min(others, key=lambda x: x["ttft_s"]) if others else None
        print(f"  {1e3 * r['ttft_s']:5.0f} {1e3 * d['estimated_ttft_s']:6.0f} {r['prompt_tokens']:7d} "
              f"{r['cached_tokens']:7d} {d['worker']:7d} {1e3 * queue_s(c, d):6.0f} "
              f"{1e3 * (r['prompt_tokens'] - r['cached_tokens']) / r_c:5.0f}  "
              + (f"{1e3 * soon['ttft_s']:7.0f} ({soon['worker']})" if soon else "      -    ")
              + f"  {d['pull_blocks']}")

    by_send = sorted(whole, key=lambda p: p[0]["sent_unix_s"])
    late = sorted(whole, key=lambda p: -(p[0]["ttft_s"] - p[1]["estimated_ttft_s"]))[:a.late]
    print(f"the {len(late)} latest after their estimates, with what the same worker got around them:")
    for r, d in late:
        t0 = r["sent_unix_s"]
        c = chosen(d)
        print(f"  {r['prompt_tokens']} tokens ({r['cached_tokens']} cached, {d['pull_blocks']} blocks pulled) on "
              f"worker {d['worker']}: estimated {1e3 * d['estimated_ttft_s']:.0f} ms, came at {1e3 * r['ttft_s']:.0f}; "
              f"queue {c['queued_prefill_tokens']:.0f} tokens at {c['prefill_tokens_per_s']:.0f}/s")
        for r2, d2 in by_send:
            if d2["worker"] == d["worker"] and t0 - 1.5 < r2["sent_unix_s"] < t0 + r["ttft_s"]:
                print(f"    {r2['sent_unix_s'] - t0:+7.3f} s  {r2['prompt_tokens']:6d} tokens  "
                      f"{r2['cached_tokens']:6d} cached  first token {1e3 * r2['ttft_s']:5.0f} ms  "
                      f"(estimated {1e3 * d2['estimated_ttft_s']:5.0f})  pulled {d2['pull_blocks']}")


if __name__ == "__main__":
    main()
