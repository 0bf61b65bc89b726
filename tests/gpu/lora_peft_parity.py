#!/usr/bin/env python3
"""Greedy tokens of a base model with a LoRA adapter, through HF transformers + PEFT.

The reference kvfleet's cuda backend must reproduce with the same adapter (lora_peft_parity,
tests/gpu/lora_peft_parity.cc): 32 greedy tokens, identical.

  1. With --write-adapter (or when ADAPTER has no adapter_config.json), writes a random PEFT
     adapter for the model's config: adapter_config.json and adapter_model.safetensors (fp32,
     PEFT's names: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, ...), A and
     B both random (PEFT starts B at zero, which would make the adapter a no-op). `kvfleet
     make-model --lora` writes the same format.
  2. Loads MODEL with transformers (eager attention) in --dtype, wraps it with
     PeftModel.from_pretrained(ADAPTER), and extends the prompt greedily by --steps tokens with
     the KV cache.
  3. Writes OUT: {"prompt": [...], "tokens": [...], "gaps": [...], "top": [...], "second": [...]}
     (per step: gaps, the top-1 minus top-2 logit; top, the top-1 logit; second, the runner-up
     token), so that lora_peft_parity tells a tie in HF's logits from a real difference.

  python3 lora_peft_parity.py --model DIR --adapter DIR [--write-adapter --rank 16 --alpha 32
      --seed 1] [--dtype bf16|fp32] [--steps 32] --out tokens.json
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

TARGETS = [("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
           ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")]


def target_dims(cfg, module):
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    q, kv, inter = nh * hd, kvh * hd, cfg["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}[module]


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, arr in tensors:
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for _, arr in tensors:
            f.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())


def write_adapter(model_dir, adapter_dir, rank, alpha, seed):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    rng = np.random.default_rng(seed)
    tensors = []
    for layer in range(cfg["num_hidden_layers"]):
        for block, module in TARGETS:
            d_in, d_out = target_dims(cfg, module)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            a = rng.uniform(-1.0, 1.0, size=(rank, d_in)).astype(np.float32) / np.float32(np.sqrt(d_in))
            b = rng.uniform(-0.05, 0.05, size=(d_out, rank)).astype(np.float32)
            tensors.append((prefix + ".lora_A.weight", a))
            tensors.append((prefix + ".lora_B.weight", b))
    os.makedirs(adapter_dir, exist_ok=True)
    write_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"), tensors)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
        "target_modules": [m for _, m in TARGETS],
        "base_model_name_or_path": os.path.basename(os.path.normpath(model_dir)),
    }
    with open(os.path.join(adapter_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote a rank-{rank} adapter over {len(TARGETS)} targets x {cfg['num_hidden_layers']} layers to {adapter_dir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--write-adapter", action="store_true")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.write_adapter or not os.path.exists(os.path.join(args.adapter, "adapter_config.json")):
        write_adapter(args.model, args.adapter, args.rank, args.alpha, args.seed)

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, args.adapter).to(device).eval()
    vocab = base.config.vocab_size
    # The prompt lora_peft_parity.cc uses: a fixed stride over the vocabulary.
    prompt = [(i * 7919) % min(vocab - 100, 20000) + 50 for i in range(args.prompt_len)]
    tokens, gaps, tops, seconds = [], [], [], []
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        out = model(input_ids=ids, use_cache=True)
        for _ in range(args.steps):
            logits = out.logits[0, -1].float()
            top = torch.topk(logits, 2)
            tok = int(top.indices[0])
            tokens.append(tok)
            gaps.append(float(top.values[0] - top.values[1]))
            tops.append(float(top.values[0]))
            seconds.append(int(top.indices[1]))
            out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=out.past_key_values,
                        use_cache=True)
    with open(args.out, "w") as f:
        json.dump({"prompt": prompt, "tokens": tokens, "gaps": gaps, "top": tops, "second": seconds,
                   "dtype": args.dtype}, f)
    print(f"HF + PEFT ({args.dtype}, {device}): {len(tokens)} greedy tokens -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
