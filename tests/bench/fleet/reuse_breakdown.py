#!/usr/bin/env python3
"""Where the cached-token ratio of a `kvfleet bench` run goes, next to the trace's ideal.

  reuse_breakdown.py --trace T.jsonl --time-scale X --length-scale Y [--duration S] \
      --requests R.jsonl [--policy kv] [--warmup-s S] [--cache-tokens N] [--fleet-cache-tokens N]

R is `kvfleet bench --requests-out` (one line per request, with the worker that served it).
For every request, in arrival order, it counts the leading full blocks (512/Y tokens) that:
  ideal     an infinite cache shared by the whole fleet would hold (the bench's "ideal");
  best_worker  the most that any one worker's infinite cache would hold (ideal -
            best_worker: the prefix was split between workers by earlier choices);
  routed    an infinite cache on the worker the request went to would hold, given where
            the earlier requests went (so ideal - routed is lost to routing: the prefix
            was on another worker);
  in_flight of those, blocks whose first request on that worker had not yet had its first
            token when this one was sent (the prefix was being computed: a worker can
            share it only once it is written);
and the tokens the worker reported cached (`actual`). routed - actual is lost at the
worker: eviction (finite cache) or a prefix still being computed.

With `--fleet-cache-tokens N` it also prints `fleet_lru`: what one LRU cache of N tokens shared by
the whole fleet would hold (e.g. 8 x 442368 for 8 mock workers). Workers that pull prefixes from
each other share their caches so; the ideal assumes an unbounded one, which a fleet of finite KV
cannot reach whatever its routing. `--warmup-s S` leaves out of every figure the arrivals of the
first S seconds, as `kvfleet bench --warmup-s` does (the caches still see them).

With `--cache-tokens N` each worker's cache is instead an LRU of N tokens (a mock worker's
device KV, e.g. 442368): a prefix its holder has evicted since is then not counted as lost
to the choice but to "no worker had it whole", which is where a policy that copies prefixes
onto several workers (crowding others out) pays.

The choice's share is then split by how the best holder got the prefix: sent there by the
same router as this request or by another (several routers, `kvfleet bench --router A,B,..`),
and whether that earlier request was still without its first token when this one was sent
(its blocks not yet stored, so another router knew of it only by its gossip, which carries no
prefixes); a request whose reported cached tokens cover the holder's match got the prefix
anyway (a pull), and is counted apart.
"""

import argparse
import json
from collections import OrderedDict, defaultdict

from trace_common import TRACE_BLOCK, add_scale_args, chain, leading, scaled_trace


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scale_args(ap)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--policy", default="")
    ap.add_argument("--cache-tokens", type=int, default=0, help="each worker's cache, an LRU of this many tokens (0: infinite)")
    ap.add_argument("--fleet-cache-tokens", type=int, default=0, help="also: one LRU of this many tokens shared by the fleet")
    ap.add_argument("--warmup-s", type=float, default=0, help="leave out the arrivals of the first S seconds")
    a = ap.parse_args()
    if a.cache_tokens < 0 or a.fleet_cache_tokens < 0:
        ap.error("--cache-tokens and --fleet-cache-tokens must be >= 0")
    block = TRACE_BLOCK // a.length_scale
    scaled = scaled_trace(a.trace, a.time_scale, a.length_scale, a.duration)
    reqs = [json.loads(l) for l in open(a.requests) if l.strip()]
    if a.policy:
        reqs = [r for r in reqs if r["policy"] == a.policy]
    assert len(reqs) == len(scaled), f"{len(reqs)} request lines for {len(scaled)} scaled requests"

    seen = set()
    # worker -> chain id -> Unix time its KV was first written there, least recently used first
    on_worker = defaultdict(OrderedDict)
    capacity = a.cache_tokens // block if a.cache_tokens else 0
    fleet_lru, fleet_capacity = OrderedDict(), a.fleet_cache_tokens // block
    totals = defaultdict(int)
    origin = defaultdict(dict)  # worker -> chain id -> router of the request that sent it there
    for (arrival, n_in, ids), r in zip(scaled, reqs):
        ch = chain(ids[: n_in // block])
        # Past the warm-up every figure counts; before it only the caches learn.
        tot = totals if arrival >= a.warmup_s else defaultdict(int)
        tot["prompt"] += n_in
        tot["ideal"] += leading(ch, seen) * block
        seen.update(ch)
        if fleet_capacity:
            tot["fleet_lru"] += leading(ch, fleet_lru) * block
            for c in ch:
                fleet_lru[c] = True
                fleet_lru.move_to_end(c)
            while len(fleet_lru) > fleet_capacity:
                fleet_lru.popitem(last=False)
        if not r["ok"]:
            tot["failed"] += 1
            continue
        w, sent = r["worker"], r["sent_unix_s"]
        mine = on_worker[w]
        routed = leading(ch, mine)
        tot["routed"] += routed * block
        best, holder = 0, None
        for x, other in on_worker.items():
            m = leading(ch, other)
            if m > best:
                best, holder = m, x
        tot["best_worker"] += best * block
        if best > routed:
            c = ch[best - 1]
            if r["cached_tokens"] >= best * block:
                kind = "cached anyway (pulled)"
            else:
                kind = ("same router" if origin[holder][c] == r.get("router") else "another router") + \
                    (", in flight" if on_worker[holder][c] > sent else ", stored")
            tot["choice: " + kind] += (best - routed) * block
        tot["in_flight"] += sum(block for c in ch[:routed] if mine[c] > sent)
        tot["actual"] += min(r["cached_tokens"], n_in)
        ready = sent + max(r["ttft_s"], 0)
        for c in ch:
            if c not in mine:
                mine[c] = ready
                origin[w][c] = r.get("router")
            mine.move_to_end(c)
        while capacity and len(mine) > capacity:
            mine.popitem(last=False)
    tot = totals
    p = tot["prompt"]
    print(f"requests {len(reqs)} (failed {tot['failed']}), block {block} tokens, prompt tokens {p}")
    for k in ("ideal",) + (("fleet_lru",) if fleet_capacity else ()) + ("best_worker", "routed", "in_flight", "actual"):
        print(f"{k:>10} {tot[k] / p:.3f}")
    print(f"lost to routing (prefix on another worker)   {(tot['ideal'] - tot['routed']) / p:.3f}")
    print(f"  of which no worker had it whole            {(tot['ideal'] - tot['best_worker']) / p:.3f}")
    print(f"  of which the choice (load over hit)        {(tot['best_worker'] - tot['routed']) / p:.3f}")
    for k in sorted(t for t in tot if t.startswith("choice: ")):
        print(f"    {k[8:]:<41}{tot[k] / p:.3f}")
    print(f"lost at the worker (eviction, in flight)     {(tot['routed'] - tot['actual']) / p:.3f}")


if __name__ == "__main__":
    main()
