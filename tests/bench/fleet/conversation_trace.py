#!/usr/bin/env python3
"""Writes a Mooncake-format trace (tests/bench/traces/README.md) of multi-turn conversations.

Conversations start as a Poisson process (`--rate` per second). Each opens with one of a few
shared system prompts (`--system-prompts` of `--system-blocks` 512-token trace blocks, chosen
by a Zipf law of exponent `--zipf`, 0: uniformly) and runs `--turns` turns. Turn n's prompt is
the whole conversation so far: the system prompt, every earlier user message and reply, and a
new user message. The next turn is sent a think time (exponential, mean `--think-s`) after
the previous one, plus the reply's own time, which the trace cannot know and so leaves out.

Hash ids follow the content: a block wholly inside turn n's prompt keeps its id in turn
n+1; the block that turn n's prompt left partial (and every block after it) gets a new id,
since its tokens now continue with the reply. So the reuse is the prefix sharing a chat
service sees: a conversation's history (only where its next turn lands on the same worker)
and the system prompts (anywhere).

  tests/bench/fleet/conversation_trace.py --rate 1 --turns 2:8 --duration 300 --seed 1 > conv.jsonl

Same arguments, same file: the generator draws from one seeded random.Random.
"""
import argparse
import json
import random
import sys

from trace_common import TRACE_BLOCK, int_range

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=1.0, help="conversations started per second (Poisson)")
    p.add_argument("--duration", type=float, default=300.0, help="seconds during which conversations start")
    p.add_argument("--turns", type=int_range, default=(2, 8), help="turns per conversation, N or MIN:MAX")
    p.add_argument("--think-s", type=float, default=10.0, help="mean seconds between a conversation's turns")
    p.add_argument("--system-prompts", type=int, default=4, help="distinct system prompts")
    p.add_argument("--system-blocks", type=int, default=2, help="512-token trace blocks per system prompt")
    p.add_argument("--user-tokens", type=int_range, default=(64, 1024), help="tokens per user message")
    p.add_argument("--output-tokens", type=int_range, default=(64, 512), help="tokens per reply")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the system prompt choice (0: uniform)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("system_prompts", "system_blocks"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not a.rate > 0 or not a.duration > 0:
        p.error("--rate and --duration must be > 0")
    if not a.think_s >= 0:
        p.error("--think-s must be >= 0")
    if a.zipf < 0:
        p.error("--zipf must be >= 0")

    rng = random.Random(a.seed)
    weights = [1.0 / (k + 1) ** a.zipf for k in range(a.system_prompts)]
    next_id = a.system_prompts * a.system_blocks
    lines = []
    start = 0.0
    while True:
        start += rng.expovariate(a.rate)
        if start >= a.duration:
            break
        k = rng.choices(range(a.system_prompts), weights)[0]
        ids = list(range(k * a.system_blocks, (k + 1) * a.system_blocks))  # whole blocks so far
        length = a.system_blocks * TRACE_BLOCK  # tokens so far
        t = start
        for turn in range(rng.randint(*a.turns)):
            if turn > 0:
                t += rng.expovariate(1.0 / a.think_s) if a.think_s > 0 else 0.0
            length += rng.randint(*a.user_tokens)
            kept = ids  # whole blocks of the previous prompt keep their ids; the rest is new content
            blocks = -(-length // TRACE_BLOCK)
            fresh = list(range(next_id, next_id + blocks - len(kept)))
            next_id += len(fresh)
            output = rng.randint(*a.output_tokens)
            lines.append((t, {"timestamp": int(t * 1000), "input_length": length, "output_length": output,
                              "hash_ids": kept + fresh}))
            length += output
            ids = (kept + fresh)[: (length - output) // TRACE_BLOCK]
    lines.sort(key=lambda x: x[0])
    for _, line in lines:
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
