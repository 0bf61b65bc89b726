#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for kvfleet's random models.

kvfleet's cpu backend must match transformers (fp32, eager attention): this script
computes what it is compared with. For each model of a manifest it
  1. rebuilds the model's weights with make-model's rule (worker/model/random_model.h),
     reimplemented here in numpy, and where the manifest carries the C++ make-model's own
     model.safetensors, checks that both are bit-identical;
  2. loads the directory with transformers' from_pretrained (so our safetensors and
     config.json are read by HF's own loader), in fp32 with eager attention;
  3. for each prompt, greedily extends it by 16 tokens (the manifest entry's "decode_steps"
     where given; a full forward pass per step, no KV cache, so nothing but the model's
     math is involved), then runs one forward pass
     over prompt + generated tokens and records, for every position, the logits at 128
     fixed columns (a stride over the vocab) and at the row's top 8 columns.

Output per model NAME: NAME.json (prompts, greedy tokens, column ids, shapes) and
NAME.logits.f32 (little-endian float32 [rows][8 + 128], rows = every position of every
prompt in order: first the 8 top-column values, then the 128 stride-column values).

  python3 make_reference.py --manifest manifest.json --out OUT_DIR
  python3 make_reference.py --rope --out rope_reference.json
      (transformers' inv_freq and attention_scaling for ROPE_CASES: default, linear, llama3,
      yarn variants, dynamic at several lengths; compared by rope_reference_test.cc)
  python3 make_reference.py --check DIR --seed N [--dtype fp32]
      (numpy only: checks that this generator and the C++ make-model wrote DIR's weights alike)
  python3 make_reference.py --make-model --config config.json --seed N --dtype bf16 --out DIR
      (writes make-model's weights for that config.json, e.g. on a GPU machine without the
      kvfleet binary: take config.json from `kvfleet make-model --shape S --config-only`
      run anywhere, with the tokenizer files; llama-3.1-8b in bf16 (16 GB, 4 shards) takes
      about 4.5 minutes on the 16-core GPU machine)
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

MASK64 = (1 << 64) - 1
TOP_K = 8
STRIDE_COLUMNS = 128
DECODE_STEPS = 16
CHUNK = 1 << 22


def splitmix64_np(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for ch in s.encode():
        h ^= ch
        h = (h * 0x100000001B3) & MASK64
    return h


def sparse_layers(cfg):
    """Which layers' MLP is an MoE block (worker/model/model_config.cc ParseMoe), as HF builds them."""
    arch, n = cfg["architectures"][0], cfg["num_hidden_layers"]
    if arch == "MixtralForCausalLM":
        return [True] * n
    if arch == "Qwen3MoeForCausalLM" and cfg.get("num_experts", 128) > 0:
        only, step = cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1)
        return [l not in only and (l + 1) % step == 0 for l in range(n)]
    return [False] * n


def moe_tensors(cfg, p):
    """(name, shape) of one MoE block, layer prefix p: the router, then each expert's gate, up and down."""
    h = cfg["hidden_size"]
    if cfg["architectures"][0] == "MixtralForCausalLM":
        experts, inter, block, names = cfg.get("num_local_experts", 8), cfg["intermediate_size"], "block_sparse_moe", \
            ("w1", "w3", "w2")
    else:
        experts, inter, block, names = cfg.get("num_experts", 128), cfg.get("moe_intermediate_size", 768), "mlp", \
            ("gate_proj", "up_proj", "down_proj")
    out = [(f"{p}{block}.gate.weight", [experts, h])]
    for e in range(experts):
        q = f"{p}{block}.experts.{e}."
        out += [(q + names[0] + ".weight", [inter, h]), (q + names[1] + ".weight", [inter, h]),
                (q + names[2] + ".weight", [h, inter])]
    return out


def regenerated(cfg):
    """Whether expected_tensors knows this architecture's tensors (else the entry names a make-model dir)."""
    return cfg["architectures"][0] != "Llama4ForCausalLM"


def expected_tensors(cfg):
    """(name, shape) in make-model's order (worker/model/checkpoint.cc ExpectedTensors)."""
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    q, kv, inter = nh * hd, kvh * hd, cfg["intermediate_size"]
    arch = cfg["architectures"][0]
    biased = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM") and cfg.get("attention_bias", False)
    qkv_bias = arch == "Qwen2ForCausalLM" or biased
    o_bias = biased
    mlp_bias = arch == "LlamaForCausalLM" and cfg.get("mlp_bias", False)
    qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    sparse = sparse_layers(cfg)
    out = [("model.embed_tokens.weight", [cfg["vocab_size"], h])]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", [h]))
        out += [(p + "self_attn.q_proj.weight", [q, h]), (p + "self_attn.k_proj.weight", [kv, h]),
                (p + "self_attn.v_proj.weight", [kv, h])]
        if qkv_bias:
            out += [(p + "self_attn.q_proj.bias", [q]), (p + "self_attn.k_proj.bias", [kv]),
                    (p + "self_attn.v_proj.bias", [kv])]
        out.append((p + "self_attn.o_proj.weight", [h, q]))
        if o_bias:
            out.append((p + "self_attn.o_proj.bias", [h]))
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
        out.append((p + "post_attention_layernorm.weight", [h]))
        if sparse[l]:
            out += moe_tensors(cfg, p)
            continue
        out += [(p + "mlp.gate_proj.weight", [inter, h]), (p + "mlp.up_proj.weight", [inter, h]),
                (p + "mlp.down_proj.weight", [h, inter])]
        if mlp_bias:
            out += [(p + "mlp.gate_proj.bias", [inter]), (p + "mlp.up_proj.bias", [inter]),
                    (p + "mlp.down_proj.bias", [h])]
    out.append(("model.norm.weight", [h]))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [cfg["vocab_size"], h]))
    return out


def init_range(name, shape, hidden):
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return 2.0 * math.sqrt(3.0 / hidden), 0.0
    if name.endswith("norm.weight"):
        return 0.25, 1.0
    if name.endswith(".bias"):
        return 0.5, 0.0
    return math.sqrt(3.0 / shape[-1]), 0.0


def f32_to_bf16_bits(f):
    u = f.view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    with np.errstate(over="ignore"):
        r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16), r)


def random_tensor(seed, name, shape, hidden, bf16):
    """make-model's weights: fp32 values, or bf16 bits (uint16) when bf16."""
    half_range, centre = init_range(name, shape, hidden)
    step = np.float32(half_range / 8388608.0)
    key = splitmix64((seed ^ fnv1a64(name)) & MASK64)
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.uint16 if bf16 else np.float32)
    for b in range(0, n, CHUNK):
        e = min(n, b + CHUNK)
        with np.errstate(over="ignore"):
            x = np.uint64(key) + np.arange(b, e, dtype=np.uint64)
        r = (splitmix64_np(x) >> np.uint64(40)).astype(np.int64) - (1 << 23)
        v = (r.astype(np.float32) + np.float32(0.5)) * step
        v = v + np.float32(centre)
        out[b:e] = f32_to_bf16_bits(v) if bf16 else v
    return out.reshape(shape)


def write_model(cfg, seed, bf16, out_dir, max_shard_bytes=5_000_000_000):
    """Writes config.json and the safetensors (sharded like make-model above 5 GB), one shard in memory at a time."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    specs = expected_tensors(cfg)
    esize = 2 if bf16 else 4
    shards, size = [[]], 0
    for name, shape in specs:
        b = int(np.prod(shape)) * esize
        if shards[-1] and size + b > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += b
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            a = random_tensor(seed, name, shape, cfg["hidden_size"], bf16)
            tensors[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(a)
            weight_map[name] = fname
            total += a.nbytes
        save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
        del tensors
    if len(shards) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file, read without torch."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[base + b:base + e])
    return out


def check_against_file(cfg, seed, bf16, path):
    """Bit-compares the numpy generator with a C++ make-model safetensors file."""
    stored = read_safetensors(path)
    for name, shape in expected_tensors(cfg):
        mine = random_tensor(seed, name, shape, cfg["hidden_size"], bf16)
        dtype, s, raw = stored[name]
        if s != list(shape) or dtype != ("BF16" if bf16 else "F32") or mine.tobytes() != raw:
            raise SystemExit(f"generator mismatch: {name} differs from {path}")
    print(f"  generator: all {len(stored)} tensors of {path} bit-identical", flush=True)


def load_hf(model_dir):
    import torch
    from transformers import AutoModelForCausalLM
    kw = dict(attn_implementation="eager")
    kw["output_loading_info"] = True
    try:
        m, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    except TypeError:
        m, info = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kw)
    # A tensor HF did not read (an MoE checkpoint's names it does not convert, say) would leave
    # its parameter randomly initialised: the reference would be of another model.
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise SystemExit(f"{model_dir}: transformers did not load the checkpoint as written: {bad}")
    return m.float().eval()


def reference(entry, work, out_dir):
    import torch
    name, seed = entry["name"], entry["seed"]
    cfg = entry.get("config") or json.load(open(os.path.join(entry["dir"], "config.json")))  # a "dir" entry may omit it
    bf16 = entry.get("dtype", "bf16") == "bf16"
    t0 = time.time()
    model_dir = entry.get("dir")
    if model_dir and os.path.exists(os.path.join(model_dir, "model.safetensors")) and not regenerated(cfg):
        # This script does not rebuild this architecture's weights: it reads the C++
        # make-model's own directory (the test regenerates the same one with the same seed).
        print(f"  {name}: weights as make-model wrote them in {model_dir}", flush=True)
    elif model_dir and os.path.exists(os.path.join(model_dir, "model.safetensors")):
        check_against_file(cfg, seed, bf16, os.path.join(model_dir, "model.safetensors"))
    elif not regenerated(cfg):
        raise SystemExit(f"{name}: {cfg['architectures'][0]} needs \"dir\": a directory kvfleet make-model wrote")
    else:
        model_dir = os.path.join(work, name)
        write_model(cfg, seed, bf16, model_dir)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_hf(model_dir).to(dev)
    vocab = cfg["vocab_size"]
    rng = np.random.default_rng(1000 + seed)
    prompts = [rng.integers(0, min(vocab, 32000), size=n).tolist() for n in entry.get("prompt_lengths", [5, 24, 45])]
    columns = list(range(0, vocab, (vocab + STRIDE_COLUMNS - 1) // STRIDE_COLUMNS))[:STRIDE_COLUMNS]
    while len(columns) < STRIDE_COLUMNS:
        columns.append(vocab - 1 - len(columns))
    col_t = torch.tensor(columns, device=dev)
    rows, greedy, top_ids, max_abs = [], [], [], 0.0
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(entry.get("decode_steps", DECODE_STEPS)):
                logits = model(torch.tensor([ids], device=dev)).logits[0, -1]
                ids.append(int(torch.argmax(logits).item()))
            greedy.append(ids[len(p):])
            logits = model(torch.tensor([ids], device=dev)).logits[0].float()  # [len, vocab]
            max_abs = max(max_abs, float(logits.abs().max()))
            top = torch.topk(logits, TOP_K, dim=-1)
            top_ids.append(top.indices.cpu().tolist())
            rows.append(torch.cat([top.values, logits[:, col_t]], dim=1).cpu().numpy().astype("<f4"))
            # The last full pass must agree with the step-by-step greedy choices.
            assert torch.argmax(logits[len(p) - 1:-1], dim=-1).cpu().tolist() == ids[len(p):], "greedy mismatch"
    meta = dict(name=name, shape=entry["shape"], seed=seed, dtype=entry.get("dtype", "bf16"), vocab_size=vocab,
                prompts=prompts, greedy=greedy, top_ids=top_ids, stride_columns=columns, top_k=TOP_K,
                max_abs_logit=max_abs, device=dev, torch=torch.__version__,
                transformers=__import__("transformers").__version__)
    if entry.get("bf16_rows"):
        meta["hf_bf16_rows_over"] = bf16_rows_over(model, prompts, greedy, top_ids, columns, rows, dev)
        print(f"  {name}: transformers' own bf16: {meta['hf_bf16_rows_over']} rows past {BF16_TOLERANCE}", flush=True)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f)
    np.concatenate(rows).tofile(os.path.join(out_dir, name + ".logits.f32"))
    print(f"  {name}: {sum(len(r) for r in rows)} rows, max |logit| {max_abs:.2f}, {time.time() - t0:.1f} s",
          flush=True)


BF16_TOLERANCE = 0.2  # tests/gpu/cuda_parity.h kBf16Tolerance


def bf16_rows_over(model, prompts, greedy, top_ids, columns, rows, dev):
    """The rows of the fixture whose logits from transformers' own bf16 inference (the model
    cast to bf16, router included) differ from the fp32 ones by more than BF16_TOLERANCE at
    the recorded columns: the floor that precision alone sets for a bf16 implementation (an
    MoE router flips between near-equal experts), which cuda_moe_test's bar is measured from."""
    import torch
    model = model.to(torch.bfloat16)
    over = 0
    with torch.no_grad():
        for p, prompt in enumerate(prompts):
            ids = list(prompt) + greedy[p]
            logits = model(torch.tensor([ids], device=dev)).logits[0].float().cpu().numpy()
            for pos in range(len(ids)):
                got = logits[pos, top_ids[p][pos] + columns]
                over += int(np.max(np.abs(got - rows[p][pos])) > BF16_TOLERANCE)
    model.float()
    return over


# RoPE configurations whose frequencies and attention scaling kvfleet (kernels/rope.h) must
# reproduce: tests/worker/model/rope_reference_test.cc parses each `config` as config.json and
# compares. Each case: name, fields over ROPE_BASE, and the sequence lengths to sample (None:
# as loaded; N: after a forward pass over positions 0..N-1, which is when dynamic NTK
# recomputes). Wherever a yarn config names original_max_position_embeddings,
# max_position_embeddings is factor times it, so transformers 4.5x (which took the factor
# from that ratio) and 5 (which keeps the explicit factor) agree.
ROPE_BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=1000, hidden_size=256,
                 intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0)
QWEN3_ROPE = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=4096, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960)
ROPE_CASES = [
    ("default", {}, [None]),
    ("default-qwen3", QWEN3_ROPE, [None]),
    ("linear", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), [None]),
    ("llama3", dict(head_dim=128, rope_theta=500000.0, max_position_embeddings=131072,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), [None]),
    ("yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), [None]),
    ("yarn-qwen3", dict(QWEN3_ROPE, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
     [None]),
    ("yarn-mscale-equal", dict(max_position_embeddings=163840, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}), [None]),
    ("yarn-mscale", dict(max_position_embeddings=163840, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
        "mscale_all_dim": 0.8}), [None]),
    ("yarn-attention-factor", dict(max_position_embeddings=16384, rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048, "attention_factor": 0.8,
        "beta_fast": 16, "beta_slow": 2}), [None]),
    ("yarn-no-truncate", dict(rope_theta=150000.0, max_position_embeddings=131072, rope_scaling={
        "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False}), [None]),
    ("dynamic", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), [None, 4096, 4097, 6000, 16384]),
    ("dynamic-qwen3", dict(QWEN3_ROPE, rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
     [None, 40960, 40961, 100000]),
]


def rope_reference(out_path):
    """Writes transformers' own inv_freq and attention_scaling for ROPE_CASES to out_path."""
    import inspect
    import torch
    import transformers
    from transformers import modeling_rope_utils
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
    rotary_of = {"llama": (transformers.LlamaConfig, LlamaRotaryEmbedding),
                 "qwen3": (transformers.Qwen3Config, Qwen3RotaryEmbedding)}
    has_truncate = "truncate" in inspect.getsource(modeling_rope_utils._compute_yarn_parameters)
    cases = []
    for name, fields, seq_lens in ROPE_CASES:
        cfg = dict(ROPE_BASE, **fields)
        if "truncate" in cfg.get("rope_scaling", {}) and not has_truncate:
            print(f"  {name}: skipped (this transformers has no yarn truncate)", flush=True)
            continue
        config_cls, rotary_cls = rotary_of[cfg["model_type"]]
        for seq_len in seq_lens:
            kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
            kwargs = json.loads(json.dumps(kwargs))  # the config may rewrite its rope dict in place
            rotary = rotary_cls(config=config_cls(**kwargs), device="cpu")
            if seq_len:  # HF's dynamic update runs in forward, from the largest position
                with torch.no_grad():
                    rotary(torch.zeros(1, 1, 1, dtype=torch.float32), torch.arange(seq_len)[None])
            cases.append(dict(name=name, config=cfg, seq_len=seq_len or 0,
                              inv_freq=rotary.inv_freq.float().tolist(),
                              attention_scaling=float(rotary.attention_scaling)))
            print(f"  {name} seq_len {seq_len}: {len(cases[-1]['inv_freq'])} frequencies, "
                  f"attention scaling {cases[-1]['attention_scaling']:.6f}", flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(torch=torch.__version__, transformers=transformers.__version__, cases=cases), f)
        f.write("\n")
    print(f"{out_path}: {len(cases)} cases", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest")
    ap.add_argument("--out")
    ap.add_argument("--work", default="/tmp/kvfleet-reference")
    ap.add_argument("--make-model", action="store_true")
    ap.add_argument("--config")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rope", action="store_true", help="write transformers' RoPE frequencies to --out (a .json)")
    ap.add_argument("--check", metavar="DIR", help="bit-compare DIR/model.safetensors (C++ make-model, --seed, "
                    "--dtype) with this generator; numpy only")
    a = ap.parse_args()
    if a.check:
        with open(os.path.join(a.check, "config.json")) as f:
            check_against_file(json.load(f), a.seed, a.dtype == "bf16", os.path.join(a.check, "model.safetensors"))
        return
    if not a.out:
        ap.error("--out is required")
    if a.rope:
        rope_reference(a.out)
        return
    if a.make_model:
        with open(a.config) as f:
            write_model(json.load(f), a.seed, a.dtype == "bf16", a.out)
        return
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with open(a.manifest) as f:
        manifest = json.load(f)
    base = os.path.dirname(os.path.abspath(a.manifest))
    os.makedirs(a.out, exist_ok=True)
    for entry in manifest:
        if entry.get("dir"):
            entry["dir"] = os.path.join(base, entry["dir"])
        print(f"{entry['name']} ({entry['shape']}, seed {entry['seed']}):", flush=True)
        reference(entry, a.work, a.out)


if __name__ == "__main__":
    sys.exit(main())
