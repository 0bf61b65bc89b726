#!/usr/bin/env python3
"""Measures the mock backend's cost-model constants on a real GPU.

Runs the forward pass of a Llama-3.1-8B-shaped model (random bf16 weights: 32 layers,
hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 128256) with PyTorch on the
local GPU, the way an optimized engine does: cuBLAS GEMMs, flash attention (SDPA) for
prefill, a GQA attention read of the KV cache for decode, and decode steps replayed as
CUDA graphs so no Python overhead is timed. Then fits

    step = a + b*(prefill tokens) + c*(decode sequences) + d*(KV tokens read)

(the mock's model, worker/backend/mock/cost_model.h): a, c and d by least squares over
decode steps of 1..128 sequences at 512..4096 tokens of context, then b over prefill steps
of 256..4096 tokens; prints the constants in microseconds.

    python3 tests/bench/worker/calibrate_mock.py   # needs torch and a CUDA GPU
"""
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

H, I, LAYERS, NH, KVH, D, V = 4096, 14336, 32, 32, 8, 128, 128256
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)


def w(*shape):
    return (torch.randn(*shape, device=dev, dtype=dt) * 0.02)


layers = [dict(qkv=w(H, (NH + 2 * KVH) * D), o=w(NH * D, H), gu=w(H, 2 * I), down=w(I, H)) for _ in range(LAYERS)]
lm_head = w(H, V)
norm = lambda x: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dt)


def mlp(x, l):
    g, u = (x @ l["gu"]).split(I, dim=-1)
    return (F.silu(g) * u) @ l["down"]


def prefill(x):  # x: [N, H], one sequence, causal
    n = x.shape[0]
    for l in layers:
        q, k, v = (norm(x) @ l["qkv"]).split([NH * D, KVH * D, KVH * D], dim=-1)
        # [1, heads, n, D]: the 4-D layout flash attention takes.
        q = q.view(1, n, NH, D).transpose(1, 2)
        k = k.view(1, n, KVH, D).transpose(1, 2).repeat_interleave(NH // KVH, dim=1)
        v = v.view(1, n, KVH, D).transpose(1, 2).repeat_interleave(NH // KVH, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(n, NH * D) @ l["o"]
        x = x + mlp(norm(x), l)
    return norm(x[-1:]) @ lm_head


def make_decode(s, ctx):
    x = torch.randn(s, H, device=dev, dtype=dt)
    kc = [torch.randn(s, KVH, ctx, D, device=dev, dtype=dt) for _ in layers]
    vc = [torch.randn(s, KVH, ctx, D, device=dev, dtype=dt) for _ in layers]

    def step():
        y = x
        for l, k, v in zip(layers, kc, vc):
            q = (norm(y) @ l["qkv"])[:, : NH * D].view(s, KVH, NH // KVH, D)
            p = torch.softmax((q @ k.transpose(-1, -2)).float() * D ** -0.5, dim=-1).to(dt)
            a = (p @ v).reshape(s, NH * D)
            y = y + a @ l["o"]
            y = y + mlp(norm(y), l)
        return (norm(y) @ lm_head).argmax(-1)

    return step, (kc, vc)


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


rows, ys = [], []
with torch.inference_mode():
    for n in (256, 512, 1024, 2048, 4096):
        x = torch.randn(n, H, device=dev, dtype=dt)
        t = timed(lambda: prefill(x), 5)
        rows.append([1, n, 0, n]); ys.append(t)
        print(f"prefill {n:5d} tokens: {t * 1e3:7.2f} ms", flush=True)
    for ctx in (512, 2048, 4096):
        for s in (1, 8, 32, 64, 128):
            if s * ctx > 128 * 2048:
                continue  # KV memory
            step, keep = make_decode(s, ctx)
            step()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            t = timed(g.replay, 20)
            rows.append([1, 0, s, s * (ctx + 1)]); ys.append(t)
            print(f"decode {s:4d} seqs x {ctx:5d} ctx: {t * 1e3:7.2f} ms", flush=True)
            del g, step, keep
            torch.cuda.empty_cache()

A, y = np.array(rows, dtype=float), np.array(ys) * 1e6  # microseconds
# a, c, d from the decode steps (weight-streaming floor, per sequence, per KV token read);
# then b from the prefill steps given a and d.
dec = A[:, 2] > 0
acd, *_ = np.linalg.lstsq(A[dec][:, [0, 2, 3]], y[dec], rcond=None)
a, c, d = np.maximum(acd, 0)
pre = ~dec
b = float(np.sum((y[pre] - a - d * A[pre, 3]) * A[pre, 1]) / np.sum(A[pre, 1] ** 2))
coef = np.array([a, max(b, 0), c, d])
pred = A @ coef
names = ["step_base_us (a)", "prefill_token_us (b)", "decode_seq_us (c)", "kv_token_read_us (d)"]
print("fit on", torch.cuda.get_device_name(), "torch", torch.__version__)
for n_, c in zip(names, coef):
    print(f"  {n_:24s} {c:10.4f}")
print(f"  max relative error of the fit: {np.max(np.abs(pred - y) / y) * 100:.1f}%")
print(json.dumps(dict(zip(["a", "b", "c", "d"], [round(float(c), 4) for c in coef]))))
