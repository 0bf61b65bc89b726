"""Pieces shared by the trace generators and readers in this folder (Mooncake's JSONL format)."""
import argparse
import json
import math

TRACE_BLOCK = 512  # tokens per hash id in the Mooncake format


def int_range(text):
    """argparse type for "N" or "MIN:MAX" (1 <= MIN <= MAX); returns (lo, hi)."""
    lo, _, hi = text.partition(":")
    lo, hi = int(lo), int(hi or lo)
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"'{text}': want N or MIN:MAX with 1 <= MIN <= MAX")
    return lo, hi


def chain(ids):
    """A prompt's blocks named by their whole prefix: the same ids after another prefix differ."""
    out, prefix = [], ()
    for i in ids:
        prefix = prefix + (i,)
        out.append(hash(prefix))
    return out


def leading(ch, *held):
    """How many of the chain's first blocks are in one of the `held` collections, up to the first
    that is in none: a prefix hit needs every block before it."""
    n = 0
    while n < len(ch) and any(ch[n] in h for h in held):
        n += 1
    return n


def scaled_trace(path, time_scale, length_scale, duration=0):
    """The trace's requests as `kvfleet bench` replays them: (arrival s, prompt tokens, hash ids)
    in arrival order, arrivals / time_scale, lengths / length_scale, those before `duration`."""
    trace = [json.loads(l) for l in open(path) if l.strip()]
    trace.sort(key=lambda r: r["timestamp"])  # stable, as the bench
    t0 = trace[0]["timestamp"]
    out = []
    for r in trace:
        arrival = (r["timestamp"] - t0) / 1000.0 / time_scale
        if duration > 0 and arrival >= duration:
            break
        out.append((arrival, math.ceil(r["input_length"] / length_scale), r["hash_ids"]))
    return out


def add_scale_args(ap):
    """The trace and how `kvfleet bench` scaled it: --trace, --time-scale, --length-scale, --duration."""
    ap.add_argument("--trace", required=True)
    ap.add_argument("--time-scale", type=float, default=1)
    ap.add_argument("--length-scale", type=int, default=1)
    ap.add_argument("--duration", type=float, default=0)
