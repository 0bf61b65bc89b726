#!/usr/bin/env python3
"""Llama 4's text model in pure Python (standard library only), as transformers'
modeling_llama4.py computes it, for cpu_llama4_test.cc: an implementation independent of
kvfleet's that reads the checkpoint itself.

    llama4_reference.py MODEL_DIR TOKEN_ID...   prints {"logits": [[...] per token]} as JSON

Reads config.json (Llama4ForCausalLM, or Llama4ForConditionalGeneration's text_config with
tensors under language_model.) and the safetensors files (bf16 or fp32). Arithmetic is in
Python floats (double); the semantics are transformers':
  - RMSNorm x / sqrt(mean(x^2) + eps) * w; SwiGLU MLPs; residuals around attention and MLP.
  - RoPE on interleaved pairs (2i, 2i+1) with llama3-scaled frequencies, on layers whose
    no_rope_layers entry is 1; then, with use_qk_norm, a weightless RMSNorm of q and k heads.
  - NoPE layers: q scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1.
  - chunked_attention layers see keys of their query's chunk only; full_attention layers all
    earlier keys. Scale head_dim^-0.5; GQA.
  - MoE layers: router logits, top-k, sigmoid scores; expert e runs on score * x, its
    gate_up_proj [E][H][2I] and down_proj [E][I][H] applied as x @ W; plus the shared expert.
"""
import json
import math
import os
import struct
import sys


def load_tensors(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        (header_len,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + header_len])
        base = 8 + header_len
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            raw = data[base + begin:base + end]
            if meta["dtype"] == "BF16":
                halves = struct.unpack("<%dH" % (len(raw) // 2), raw)
                values = struct.unpack("<%df" % len(halves), struct.pack("<%dI" % len(halves), *[h << 16 for h in halves]))
            elif meta["dtype"] == "F32":
                values = struct.unpack("<%df" % (len(raw) // 4), raw)
            else:
                raise SystemExit("unsupported dtype " + meta["dtype"])
            tensors[key] = (meta["shape"], values)
    return tensors


def rows(t):
    """A 2-D tensor as a list of row lists."""
    shape, v = t
    n = shape[1]
    return [list(v[r * n:(r + 1) * n]) for r in range(shape[0])]


def matvec(w_rows, x):
    return [sum(a * b for a, b in zip(w, x)) for w in w_rows]


def rms(x, eps, w=None):
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * inv * (w[i] if w is not None else 1.0) for i, v in enumerate(x)]


def silu(v):
    return v / (1.0 + math.exp(-v))


def inv_freqs(cfg):
    dim = cfg["head_dim"]
    theta = cfg.get("rope_theta", 500000.0)
    inv = [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen > low_wavelen:
                out.append(f / factor)
            elif wavelen >= high_wavelen and high > low:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
            else:
                out.append(f)
        inv = out
    return inv


def forward(model_dir, tokens):
    with open(os.path.join(model_dir, "config.json")) as f:
        top = json.load(f)
    prefix = ""
    cfg = top
    if top["architectures"][0] == "Llama4ForConditionalGeneration":
        cfg, prefix = top["text_config"], "language_model."
    tensors = load_tensors(model_dir)
    T = lambda name: tensors[prefix + name]
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    I = cfg["intermediate_size"]
    no_rope = cfg.get("no_rope_layers") or [int((l + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for l in range(L)]
    step = cfg.get("interleave_moe_layer_step", 1)
    moe_layers = cfg.get("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, L, step))
    layer_types = cfg.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in no_rope]
    chunk = cfg.get("attention_chunk_size", 8192)
    tuning = bool(cfg.get("attn_temperature_tuning", True))
    floor_scale, attn_scale = cfg.get("floor_scale", 8192), cfg.get("attn_scale", 0.1)
    inv = inv_freqs(cfg)

    embed = T("model.embed_tokens.weight")
    xs = [list(embed[1][t * H:(t + 1) * H]) for t in tokens]
    n = len(tokens)
    for l in range(L):
        p = "model.layers.%d." % l
        wq, wk, wv, wo = (rows(T(p + "self_attn.%s_proj.weight" % m)) for m in "qkvo")
        in_norm = T(p + "input_layernorm.weight")[1]
        post_norm = T(p + "post_attention_layernorm.weight")[1]
        qs, ks, vs = [], [], []
        for pos, x in enumerate(xs):
            h = rms(x, eps, in_norm)
            q, kk, v = matvec(wq, h), matvec(wk, h), matvec(wv, h)
            heads_q = [q[i * hd:(i + 1) * hd] for i in range(nh)]
            heads_k = [kk[i * hd:(i + 1) * hd] for i in range(nkv)]
            if no_rope[l]:
                for head in heads_q + heads_k:
                    for i in range(hd // 2):
                        c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
                        a, b = head[2 * i], head[2 * i + 1]
                        head[2 * i], head[2 * i + 1] = a * c - b * s, b * c + a * s
                if cfg.get("use_qk_norm", True):
                    heads_q = [rms(hq, eps) for hq in heads_q]
                    heads_k = [rms(hk, eps) for hk in heads_k]
            elif tuning:
                scale = math.log1p(math.floor((pos + 1.0) / floor_scale)) * attn_scale + 1.0
                heads_q = [[v * scale for v in hq] for hq in heads_q]
            qs.append(heads_q)
            ks.append(heads_k)
            vs.append([v[i * hd:(i + 1) * hd] for i in range(nkv)])
        chunked = layer_types[l] == "chunked_attention" and chunk
        new_xs = []
        for pos in range(n):
            lo = pos // chunk * chunk if chunked else 0
            out = []
            for h in range(nh):
                g = h // (nh // nkv)
                scores = [sum(a * b for a, b in zip(qs[pos][h], ks[j][g])) / math.sqrt(hd) for j in range(lo, pos + 1)]
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = sum(w)
                acc = [0.0] * hd
                for wj, j in zip(w, range(lo, pos + 1)):
                    for i in range(hd):
                        acc[i] += wj / z * vs[j][g][i]
                out.extend(acc)
            attn = matvec(wo, out)
            new_xs.append([a + b for a, b in zip(xs[pos], attn)])
        xs = new_xs
        ff = p + "feed_forward."
        if l in moe_layers:
            router = rows(T(ff + "router.weight"))
            gu_shape, gu = T(ff + "experts.gate_up_proj")
            dn_shape, dn = T(ff + "experts.down_proj")
            sg, su, sd = (rows(T(ff + "shared_expert.%s_proj.weight" % m)) for m in ("gate", "up", "down"))
        else:
            g_rows, u_rows, d_rows = (rows(T(ff + "%s_proj.weight" % m)) for m in ("gate", "up", "down"))
        for pos in range(n):
            h = rms(xs[pos], eps, post_norm)
            if l in moe_layers:
                act = [silu(a) * b for a, b in zip(matvec(sg, h), matvec(su, h))]
                y = matvec(sd, act)
                logits = matvec(router, h)
                chosen = sorted(range(E), key=lambda e: (-logits[e], e))[:k]
                for e in chosen:
                    score = 1.0 / (1.0 + math.exp(-logits[e]))
                    xin = [score * v for v in h]
                    base = e * H * 2 * I
                    gate_up = [0.0] * (2 * I)
                    for r in range(H):
                        xr = xin[r]
                        row = gu[base + r * 2 * I:base + (r + 1) * 2 * I]
                        for c in range(2 * I):
                            gate_up[c] += xr * row[c]
                    act = [silu(gate_up[i]) * gate_up[I + i] for i in range(I)]
                    base = e * I * H
                    for r in range(I):
                        ar = act[r]
                        row = dn[base + r * H:base + (r + 1) * H]
                        for c in range(H):
                            y[c] += ar * row[c]
            else:
                act = [silu(a) * b for a, b in zip(matvec(g_rows, h), matvec(u_rows, h))]
                y = matvec(d_rows, act)
            xs[pos] = [a + b for a, b in zip(xs[pos], y)]
    final = T("model.norm.weight")[1]
    head = rows(T("lm_head.weight")) if not top.get("tie_word_embeddings", cfg.get("tie_word_embeddings")) else rows(embed)
    return [matvec(head, rms(x, eps, final)) for x in xs]


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    logits = forward(sys.argv[1], [int(t) for t in sys.argv[2:]])
    json.dump({"logits": logits}, sys.stdout)


if __name__ == "__main__":
    main()
