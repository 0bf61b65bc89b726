#!/usr/bin/env python3
"""The cached-token ratio a fleet's KV capacity allows on a trace, whatever the routing.

  fleet_cache_bound.py --trace T.jsonl --time-scale X --length-scale Y [--duration S] \
      [--warmup-s S] --fleet-cache-tokens N [--fleet-cache-tokens M ...]

The trace is scaled as `kvfleet bench` scales it (arrivals / X, lengths / Y, blocks of 512/Y
tokens; --duration and --warmup-s as the bench's). For each capacity N (tokens, e.g. 8 x 442368
for 8 mock workers) it prints, for the requests past the warm-up (the caches see them all):
  ideal     the leading full blocks an unbounded cache would hold (the bench's "ideal");
  lru       those one LRU cache of N tokens shared by the whole fleet would hold;
  slru      those one segmented LRU of N tokens would hold: blocks used once go before blocks
            used again (each segment LRU), so a prompt's one-off tail does not push out a prefix
            that others share; an online policy that needs no knowledge of the future;
  arc       those one ARC cache of N tokens would hold (Megiddo and Modha's adaptive replacement:
            LRU lists of blocks used once and blocks used again, the split between them moved
            by misses on recently evicted blocks of each); online, no knowledge of the future;
  opt       the blocks, leading or not, that one cache of N tokens would hold under the optimal
            eviction (Belady's: the block used again furthest in the future goes first; a
            request's blocks are inserted once it is served).
The online orders trade one workload for another: scan resistance (slru, arc) keeps shared
prefixes against one-off tails, and loses where the block used once is the one used next (a
conversation's latest turn). Compare them on more than one trace.
`opt` bounds what any fleet of that capacity can reach, routing and eviction alike: a fleet's
workers together hold no more than one cache of their summed capacity (a prefix held twice
takes its room twice), a hit needs a block's predecessors too, and the blocks of requests in
flight take room besides. A goal above `opt` is out of reach for that fleet.
"""

import argparse
import heapq
from collections import OrderedDict

from trace_common import TRACE_BLOCK, add_scale_args, chain, leading, scaled_trace


# The online orders: each returns the leading blocks the measured requests of `reqs` (measured,
# prompt tokens, chain) find in one cache of `capacity` blocks under that order.


def lru(reqs, capacity):
    """As reuse_breakdown.py's fleet_lru."""
    cache, hits = OrderedDict(), 0
    for measured, _, ch in reqs:
        hits += leading(ch, cache) if measured else 0
        for c in ch:
            cache[c] = True
            cache.move_to_end(c)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def slru(reqs, capacity):
    """A block's first use puts it in `once`; a later one moves it to `again`; `once` goes first."""
    once, again, hits = OrderedDict(), OrderedDict(), 0
    for measured, _, ch in reqs:
        hits += leading(ch, once, again) if measured else 0
        for c in ch:
            if c in again:
                again.move_to_end(c)
            elif c in once:
                del once[c]
                again[c] = True
            else:
                once[c] = True
        while len(once) + len(again) > capacity:
            (once if once else again).popitem(last=False)
    return hits


def arc(reqs, capacity):
    """Megiddo and Modha's ARC."""
    t1, t2, b1, b2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
    target = 0  # t1's target size

    def replace(in_b2):
        if t1 and (len(t1) > target or (in_b2 and len(t1) == target)):
            b1[t1.popitem(last=False)[0]] = True
        else:
            b2[t2.popitem(last=False)[0]] = True

    hits = 0
    for measured, _, ch in reqs:
        hits += leading(ch, t1, t2) if measured else 0
        for c in ch:
            if c in t1:
                del t1[c]
                t2[c] = True
            elif c in t2:
                t2.move_to_end(c)
            elif c in b1 or c in b2:
                in_b2 = c in b2
                if in_b2:
                    target = max(0, target - max(len(b1) // len(b2), 1))
                    del b2[c]
                else:
                    target = min(capacity, target + max(len(b2) // len(b1), 1))
                    del b1[c]
                if len(t1) + len(t2) >= capacity:
                    replace(in_b2)
                t2[c] = True
            else:
                if len(t1) + len(b1) == capacity:
                    if len(t1) < capacity:
                        b1.popitem(last=False)
                        replace(False)
                    else:
                        t1.popitem(last=False)
                elif len(t1) + len(t2) + len(b1) + len(b2) >= capacity:
                    if len(t1) + len(t2) + len(b1) + len(b2) >= 2 * capacity:
                        b2.popitem(last=False)
                    if len(t1) + len(t2) >= capacity:
                        replace(False)
                t1[c] = True
    return hits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scale_args(ap)
    ap.add_argument("--warmup-s", type=float, default=0)
    ap.add_argument("--fleet-cache-tokens", type=int, action="append", required=True)
    a = ap.parse_args()
    if a.time_scale <= 0 or a.length_scale < 1 or TRACE_BLOCK % a.length_scale:
        ap.error("--time-scale must be > 0 and --length-scale a divisor of 512")
    if any(n <= 0 for n in a.fleet_cache_tokens):
        ap.error("--fleet-cache-tokens must be > 0")
    block = TRACE_BLOCK // a.length_scale
    # (measured, prompt tokens, its full blocks' chain ids)
    reqs = [(arrival >= a.warmup_s, n_in, chain(ids[: n_in // block]))
            for arrival, n_in, ids in scaled_trace(a.trace, a.time_scale, a.length_scale, a.duration)]

    # Each access's next use of the same block (its request's index), for Belady.
    never = len(reqs)
    next_use = [None] * len(reqs)
    upcoming = {}
    for i in range(len(reqs) - 1, -1, -1):
        next_use[i] = [upcoming.get(c, never) for c in reqs[i][2]]
        for c in reqs[i][2]:
            upcoming[c] = i

    prompt = sum(n for measured, n, _ in reqs if measured)
    seen, ideal = set(), 0
    for measured, _, ch in reqs:
        ideal += leading(ch, seen) * block if measured else 0
        seen.update(ch)
    print(f"requests {sum(1 for r in reqs if r[0])} measured of {len(reqs)}; prompt tokens {prompt}; block {block} tokens")
    print(f"ideal {ideal / prompt:.4f}")

    for tokens in a.fleet_cache_tokens:
        capacity = tokens // block
        online = [(name, order(reqs, capacity) * block) for name, order in (("lru", lru), ("slru", slru), ("arc", arc))]
        # Belady: every block present counts; evict the furthest next use (lazy max-heap).
        cached, heap, opt_hits = {}, [], 0
        for i, (measured, _, ch) in enumerate(reqs):
            opt_hits += sum(block for c in ch if c in cached) if measured else 0
            for c, nxt in zip(ch, next_use[i]):
                cached[c] = nxt
                heapq.heappush(heap, (-nxt, c))
            while len(cached) > capacity:
                nxt, c = heapq.heappop(heap)
                if cached.get(c) == -nxt:
                    del cached[c]
        print(f"capacity {tokens} tokens ({capacity} blocks): " +
              ", ".join(f"{name} {hits / prompt:.4f} ({hits / ideal:.1%} of ideal)"
                        for name, hits in online + [("opt", opt_hits)]))


if __name__ == "__main__":
    main()
