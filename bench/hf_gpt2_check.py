#!/usr/bin/env python3
"""Boulder's exported weights in Hugging Face's GPT2LMHeadModel: the same loss on the same tokens.

One command, given the built binaries:

    python3 bench/hf_gpt2_check.py --bin build/bin --backend cuda          # on the GPU machine
    python3 bench/hf_gpt2_check.py --bin build/bin --backend cpu --hidden 64 --heads 4 \\
        --ffn 256 --context 64 --steps 20                                  # small, any machine

What it does:
 1. writes a text corpus and turns it into llm.c .bin shards with boulder-tokens (byte-level,
    vocab 256; the first --val-tokens tokens are the validation shard);
 2. trains a GPT-2-shaped model (tied head, tanh GELU, LayerNorm eps 1e-5) with boulder-trainer
    on the shards and writes its weights with --weights-out (safetensors, GPT-2 names);
 3. evaluates those weights with boulder-trainer --eval-only (model.init_from, FP32 on the cpu
    backend, and also on --backend when that is cuda, BF16);
 4. loads the same file into transformers' GPT2LMHeadModel (or, where transformers is missing,
    into a GPT-2 written here with Hugging Face's parameter names and Conv1D layouts) and
    computes the mean loss on exactly the windows Boulder's evaluation reads: the validation
    shard cut into windows of T+1 tokens at multiples of T, the first batches x batch_size;
 5. prints the losses and their differences and appends a row to --json when given.

Tolerance: FP32 against FP32 should agree to ~1e-5 relative; BF16 (the cuda backend) to ~1e-2.
"""

import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys

import torch


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


def corpus(n_bytes):
    lines, i = [], 0
    while sum(len(l) for l in lines) < n_bytes:
        lines.append(f"line {i}: the value of {i % 89} times {i % 7} is {(i % 89) * (i % 7)}.\n")
        i += 1
    return "".join(lines)


def read_safetensors(path):
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info["dtype"]
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"])
    return out


class Gpt2(torch.nn.Module):
    """GPT-2 with Hugging Face's names and layouts (Conv1D weights are [in, out])."""

    def __init__(self, v, c, nh, layers, f, ctx):
        super().__init__()
        self.nh = nh
        P = torch.nn.Parameter
        z = torch.zeros
        self.p = torch.nn.ParameterDict()
        self.names = {"wte.weight": (v, c), "wpe.weight": (ctx, c), "ln_f.weight": (c,),
                      "ln_f.bias": (c,)}
        for l in range(layers):
            h = f"h.{l}."
            self.names.update({h + "ln_1.weight": (c,), h + "ln_1.bias": (c,),
                               h + "attn.c_attn.weight": (c, 3 * c), h + "attn.c_attn.bias": (3 * c,),
                               h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
                               h + "ln_2.weight": (c,), h + "ln_2.bias": (c,),
                               h + "mlp.c_fc.weight": (c, f), h + "mlp.c_fc.bias": (f,),
                               h + "mlp.c_proj.weight": (f, c), h + "mlp.c_proj.bias": (c,)})
        self.layers = layers
        self.w = {k: z(s) for k, s in self.names.items()}

    def load(self, sd):
        sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
        missing = set(self.names) - set(sd)
        extra = set(sd) - set(self.names)
        assert not missing, f"missing {sorted(missing)}"
        assert not extra, f"unexpected {sorted(extra)}"
        for k, s in self.names.items():
            assert tuple(sd[k].shape) == s, (k, sd[k].shape, s)
            self.w[k] = sd[k].double()

    def forward(self, idx):
        w = self.w
        B, T = idx.shape
        ln = lambda x, p: torch.nn.functional.layer_norm(x, x.shape[-1:], w[p + ".weight"], w[p + ".bias"], 1e-5)
        x = w["wte.weight"][idx] + w["wpe.weight"][:T]
        C = x.shape[-1]
        hs = C // self.nh
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.layers):
            h = f"h.{l}."
            qkv = ln(x, h + "ln_1") @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
            q, k, v = qkv.split(C, dim=-1)
            q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
            m = ln(x, h + "ln_2") @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"]
            m = torch.nn.functional.gelu(m, approximate="tanh")
            x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
        return ln(x, "ln_f") @ w["wte.weight"].T


def reference_model(args, sd):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        print("transformers is not installed: using the GPT-2 written in this script", flush=True)
        m = Gpt2(256, args.hidden, args.heads, args.layers, args.ffn, args.context)
        m.load(sd)
        return "gpt2-in-script (fp64)", lambda x: m(x)
    cfg = GPT2Config(vocab_size=256, n_positions=args.context, n_embd=args.hidden,
                     n_layer=args.layers, n_head=args.heads, n_inner=args.ffn,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).double().eval()
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not re.search(r"attn\.(masked_)?bias$", k) and k != "lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)
    return "transformers GPT2LMHeadModel (fp64)", lambda x: model(x).logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="/tmp/hf_gpt2_check")
    ap.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--val-tokens", type=int, default=16384)
    ap.add_argument("--json", help="append a result row here")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    text = os.path.join(args.out, "corpus.txt")
    with open(text, "w") as f:
        f.write(corpus(400_000))
    prefix = os.path.join(args.out, "data")
    run([os.path.join(args.bin, "boulder-tokens"), "--text", text, "-o", prefix,
         "--val-tokens", str(args.val_tokens), "--shard-tokens", "200000"])
    weights = os.path.join(args.out, "model.safetensors")
    spec = os.path.join(args.out, "spec.yaml")
    T = args.context
    with open(spec, "w") as f:
        f.write(f"""name: hf-gpt2-check
model: {{vocab_size: 256, hidden: {args.hidden}, heads: {args.heads}, layers: {args.layers},
        ffn: {args.ffn}, context: {T}, tie_embeddings: true}}
data: {{source: token_files, token_files: '{prefix}_train_*.bin'}}
eval: {{token_files: '{prefix}_val_*.bin', every_steps: {args.steps}, batches: {args.batches}}}
training: {{steps: {args.steps}, batch_size: {args.batch}, seq_len: {T}, lr: 1.0e-3,
           warmup_steps: 10, log_every_steps: 10}}
generation: {{tokens: 0}}
""")
    trainer = os.path.join(args.bin, "boulder-trainer")
    run([trainer, "--spec", spec, "--backend", args.backend, "--weights-out", weights])

    def boulder_eval(backend):
        out = run([trainer, "--spec", spec, "--backend", backend, "--eval-only",
                   "--set", f"model.init_from={weights}"])
        m = re.search(r"val_loss ([0-9.]+)", out)
        assert m, out
        return float(m.group(1))

    losses = {"boulder_cpu_fp32": boulder_eval("cpu")}
    if args.backend == "cuda":
        losses["boulder_cuda_bf16"] = boulder_eval("cuda")

    with open(f"{prefix}_val_000000.bin", "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    assert header[0] == 20240520 and header[1] == 1
    tokens = torch.tensor(list(struct.unpack(f"<{header[2]}H", data[1024:])), dtype=torch.long)
    n = args.batches * args.batch
    windows = torch.stack([tokens[k * T:k * T + T + 1] for k in range(n)])
    name, forward = reference_model(args, read_safetensors(weights))
    with torch.no_grad():
        logits = forward(windows[:, :-1])
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1)).item()
    print(f"reference: {name}")
    print(f"reference loss        {ref:.6f}")
    row = {"reference": name, "reference_loss": ref, "hidden": args.hidden, "layers": args.layers,
           "context": T, "tokens": n * T, "steps": args.steps}
    for k, v in losses.items():
        rel = abs(v - ref) / ref
        print(f"{k:<21} {v:.6f}   relative difference {rel:.2e}")
        row[k] = v
        row[k + "_rel_diff"] = rel
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    ok = abs(losses["boulder_cpu_fp32"] - ref) / ref < 1e-4 and (
        "boulder_cuda_bf16" not in losses or abs(losses["boulder_cuda_bf16"] - ref) / ref < 2e-2)
    print("AGREE" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
