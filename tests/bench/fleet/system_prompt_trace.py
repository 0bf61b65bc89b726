#!/usr/bin/env python3
"""Writes a Mooncake-format trace (tests/bench/traces/README.md) in which every request
starts with one of a few shared system prompts, followed by a user message of its own.

Each system prompt is `--system-blocks` trace blocks (512 tokens each before `kvfleet bench
--length-scale`); request i picks one, uniformly or by a Zipf law (`--zipf S`, S > 0: prompt
k is chosen with weight 1/(k+1)^S), then gets fresh hash ids for its user message, so only
the system prompts are shared. Arrivals are Poisson at `--rate` requests per second.

  tests/bench/fleet/system_prompt_trace.py --system-prompts 8 --system-blocks 2 \\
      --user-tokens 256:1536 --output-tokens 32 --rate 8 --duration 120 --seed 1 > trace.jsonl

Same arguments, same file: the generator draws from one seeded random.Random.
"""
import argparse
import json
import random
import sys

from trace_common import TRACE_BLOCK, int_range

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system-prompts", type=int, default=8, help="distinct system prompts")
    p.add_argument("--system-blocks", type=int, default=2, help="512-token trace blocks per system prompt")
    p.add_argument("--user-tokens", type=int_range, default=(256, 1536), help="user message tokens, N or MIN:MAX")
    p.add_argument("--output-tokens", type=int_range, default=(32, 32), help="tokens to generate, N or MIN:MAX")
    p.add_argument("--rate", type=float, default=8.0, help="mean arrivals per second (Poisson)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    p.add_argument("--zipf", type=float, default=0.0, help="Zipf exponent of the system prompt choice (0: uniform)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("system_prompts", "system_blocks"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not a.rate > 0 or not a.duration > 0:
        p.error("--rate and --duration must be > 0")
    if a.zipf < 0:
        p.error("--zipf must be >= 0")

    rng = random.Random(a.seed)
    weights = [1.0 / (k + 1) ** a.zipf for k in range(a.system_prompts)]
    system_ids = [list(range(k * a.system_blocks, (k + 1) * a.system_blocks)) for k in range(a.system_prompts)]
    next_id = a.system_prompts * a.system_blocks
    t = 0.0
    out = sys.stdout
    while True:
        t += rng.expovariate(a.rate)
        if t >= a.duration:
            break
        k = rng.choices(range(a.system_prompts), weights)[0]
        user = rng.randint(*a.user_tokens)
        user_blocks = -(-user // TRACE_BLOCK)
        ids = system_ids[k] + list(range(next_id, next_id + user_blocks))
        next_id += user_blocks
        out.write(json.dumps({"timestamp": int(t * 1000), "input_length": a.system_blocks * TRACE_BLOCK + user,
                              "output_length": rng.randint(*a.output_tokens), "hash_ids": ids}) + "\n")


if __name__ == "__main__":
    main()
