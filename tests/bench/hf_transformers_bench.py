#!/usr/bin/env python3
"""The cuda backend's end-to-end figures side by side with Hugging Face transformers.

Runs, on the device machine, the same model directory that cuda_backend_bench reads (a
random model from `kvfleet make-model`, e.g. --shape llama-3.1-8b or qwen3-8b; any
architecture transformers' AutoModelForCausalLM loads) through transformers in bf16 with its
SDPA attention, and prints:

  decode batch 1 @ 1K   per-token time of greedy generation with the static cache
                        (cache_implementation="static"), eager and, unless --no-compile,
                        compiled (transformers compiles the static-cache forward with
                        torch.compile "reduce-overhead", i.e. CUDA graphs). Measured as
                        (T(1 + S new tokens) - T(1 new token)) / S over a 1023-token prompt,
                        so prefill and set-up cancel out and every decode step carries the
                        per-step host work that generate() does (like Execute() in ours).
  prefill 8K in 2K chunks   four forward calls of 2048 tokens against a growing cache
                        (DynamicCache), plus one forward of all 8192 tokens at once; only the
                        last position's logits are computed (logits_to_keep=1).

With --kvfleet-log FILE (cuda_backend_bench's output from the same run), it also prints
the ratios kvfleet / transformers (> 1: kvfleet is faster).

  hf_transformers_bench.py --model DIR [--steps 32] [--kvfleet-log FILE] [--no-compile]

Timing: wall clock around work ended by torch.cuda.synchronize(); medians of --reps runs
after a warm-up run. Needs torch with CUDA and transformers (>= 4.5x; written against 5.x).
"""
import argparse
import re
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache


def timed(fn, reps):
    fn()  # warm-up (and compilation when compiled)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def decode_per_token(model, prompt, steps, reps, compile_):
    """Per-token greedy decode time (s) with the static cache, eager or compiled."""
    kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0, eos_token_id=None)
    if not compile_:
        kw["disable_compile"] = True

    def gen(n):
        return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw)

    t1 = timed(gen(1), reps)
    tn = timed(gen(1 + steps), reps)
    return (tn - t1) / steps, t1


def prefill_chunked(model, ids, chunk, reps):
    def run():
        cache = DynamicCache()
        with torch.no_grad():
            for pos in range(0, ids.shape[1], chunk):
                model(input_ids=ids[:, pos:pos + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)

    return timed(run, reps)


def prefill_whole(model, ids, reps):
    def run():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return timed(run, reps)


def kvfleet_figures(path):
    """(decode b=1 ms/step, prefill ms) from cuda_backend_bench's output, or None each."""
    dec = pre = None
    with open(path) as f:
        for line in f:
            # The first figure of each: the bench's default settings.
            m = re.match(r"decode batch 1 @ \d+ context: ([0-9.]+) ms/step", line)
            if m and dec is None:
                dec = float(m.group(1))
            m = re.match(r"prefill \d+ tokens in \d+-token chunks: ([0-9.]+) ms", line)
            if m and pre is None:
                pre = float(m.group(1))
    return dec, pre


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=1024, help="decode context (prompt + 1)")
    ap.add_argument("--steps", type=int, default=32, help="timed decode tokens")
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled static-cache decode")
    ap.add_argument("--kvfleet-log", help="cuda_backend_bench output of the same run, for the ratios")
    a = ap.parse_args()

    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda",
                                                 attn_implementation="sdpa")
    model.eval()
    print(f"model loaded in {time.perf_counter() - t0:.1f} s ({(model.config.architectures or ['?'])[0]}, "
          f"{model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
          f"attention {model.config._attn_implementation})", flush=True)
    g = torch.Generator(device="cpu").manual_seed(7)
    vocab = model.config.vocab_size
    prompt = torch.randint(100, vocab - 100, (1, a.context - 1), generator=g).cuda()
    long_ids = torch.randint(100, vocab - 100, (1, a.prefill), generator=g).cuda()

    results = {}
    with torch.no_grad():
        d, t1 = decode_per_token(model, prompt, a.steps, a.reps, compile_=False)
        results["decode_eager"] = d
        print(f"hf decode batch 1 @ {a.context} context, static cache, eager: {d * 1e3:.3f} ms/token "
              f"({1 / d:.1f} tokens/s; generate of 1 token after the prompt {t1 * 1e3:.1f} ms)", flush=True)
        if not a.no_compile:
            try:
                t = time.perf_counter()
                d, t1 = decode_per_token(model, prompt, a.steps, a.reps, compile_=True)
                results["decode_compiled"] = d
                print(f"hf decode batch 1 @ {a.context} context, static cache, torch.compile: {d * 1e3:.3f} ms/token "
                      f"({1 / d:.1f} tokens/s; compile + timing {time.perf_counter() - t:.0f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on with the prefill figures
                print(f"hf decode compiled: FAILED ({type(e).__name__}: {str(e).splitlines()[0][:200]})", flush=True)
        torch.cuda.empty_cache()
        p = prefill_chunked(model, long_ids, a.chunk, a.reps)
        results["prefill_chunked"] = p
        print(f"hf prefill {a.prefill} tokens in {a.chunk}-token chunks: {p * 1e3:.1f} ms, {a.prefill / p:.0f} tokens/s",
              flush=True)
        p = prefill_whole(model, long_ids, a.reps)
        results["prefill_whole"] = p
        print(f"hf prefill {a.prefill} tokens in one forward: {p * 1e3:.1f} ms, {a.prefill / p:.0f} tokens/s", flush=True)

    if a.kvfleet_log:
        dec, pre = kvfleet_figures(a.kvfleet_log)
        print("side by side (same device, same model directory; ratio > 1: kvfleet faster)")
        if dec:
            for k in ("decode_eager", "decode_compiled"):
                if k in results:
                    hf = results[k] * 1e3
                    print(f"  decode b=1 @{a.context}: kvfleet {dec:.3f} ms/step vs hf {k[7:]} {hf:.3f} ms/token: "
                          f"{hf / dec:.2f}x")
        if pre:
            for k in ("prefill_chunked", "prefill_whole"):
                hf = results[k] * 1e3
                print(f"  prefill {a.prefill} ({a.chunk}-token chunks in kvfleet): kvfleet {pre:.1f} ms vs hf "
                      f"{k[8:]} {hf:.1f} ms: {hf / pre:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
