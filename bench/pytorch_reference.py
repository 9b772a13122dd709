#!/usr/bin/env python3
"""The PyTorch reference for Boulder's benchmarks: the same model, data and optimizer.

Model (as worker/engine/ builds it): pre-LN GPT-2 style. Token + learned position embeddings;
per layer x += proj(attn(qkv(ln1(x)))) with causal scaled-dot-product attention, then
x += fc2(gelu_tanh(fc1(ln2(x)))); final LayerNorm; untied LM head. Every Linear in the blocks
has a bias; the LM head has none (as worker/engine/param_layout.h lays it out).
The vocabulary is padded as Boulder pads it (V <= 1024: up to a multiple of 32, else of 128,
so 50257 -> 50304); the padded logits are excluded from the loss.

Data: synthetic arithmetic sequences (phase + stride * i) % V for i in 0..T, stride uniform in
[1, max_stride], phase uniform in [0, V); inputs are the first T tokens, targets the last T.

Optimizer: AdamW (fused on CUDA), lr 3e-4 constant, betas (0.9, 0.95), eps 1e-8, weight decay
0, global-norm gradient clipping at 1.0.

Timing: --steps optimizer steps in all; the first --warmup are not timed. ms_per_step is the
median over the timed steps: time.perf_counter on CPU, CUDA events around each step on GPU
(in steady state the gap between consecutive step events is the step's share of the GPU
timeline, launch-bound gaps included). The loss is read back only after the last step, so
PyTorch is never forced to synchronise mid-run.

Works with Debian's python3-torch 1.13 (CPU; no scaled_dot_product_attention there, so the
attention is written out with the same math) and PyTorch 2.x (CPU or CUDA, torch.compile).
"""

import argparse
import contextlib
import datetime
import inspect
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

PRESETS = {
    # vocab, hidden, heads, layers, ffn, context
    "minigpt": dict(vocab=96, hidden=768, heads=12, layers=4, ffn=3072, context=256),
    "gpt2": dict(vocab=50257, hidden=768, heads=12, layers=12, ffn=3072, context=1024),
}
MODES = ("eager", "compile", "reduce-overhead")


def padded_vocab(v):
    """Boulder's padding: a multiple of 32 for small vocabularies, of 128 otherwise."""
    m = 32 if v <= 1024 else 128
    return (v + m - 1) // m * m


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--preset", choices=sorted(PRESETS), default="minigpt",
                   help="model shape; the explicit flags below override its fields")
    for name in ("vocab", "hidden", "heads", "layers", "ffn", "context"):
        p.add_argument("--" + name, type=int)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--max-stride", type=int, default=6)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in all (warm-up included)")
    p.add_argument("--warmup", type=int,
                   help="leading steps not timed (default 2 for eager, 10 for the compile modes, "
                        "which compile and record CUDA graphs in their first steps)")
    p.add_argument("--mode", choices=MODES, default="eager")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (and OpenBLAS threads)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--workload", help="name for the JSON row (default: derived from the shape)")
    p.add_argument("--json", metavar="OUT", help="write the result row here (a JSON list)")
    a = p.parse_args(argv)

    for k, v in PRESETS[a.preset].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.warmup is None:
        a.warmup = 2 if a.mode == "eager" else 10
    errors = []
    if a.hidden % a.heads:
        errors.append(f"--heads {a.heads} does not divide --hidden {a.hidden}")
    if a.seq > a.context:
        errors.append(f"--seq {a.seq} is longer than --context {a.context}")
    if a.steps <= a.warmup:
        errors.append(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    if a.device == "cpu" and a.mode != "eager":
        errors.append(f"--mode {a.mode} needs --device cuda")
    if a.device == "cpu" and a.precision == "bf16":
        errors.append("--precision bf16 needs --device cuda (autocast on CPU is not what we compare)")
    if min(a.vocab, a.hidden, a.heads, a.layers, a.ffn, a.context, a.batch, a.seq,
           a.max_stride) < 1:
        errors.append("shapes, --batch, --seq and --max-stride must be positive")
    if a.threads is not None and a.threads < 1:
        errors.append("--threads must be positive")
    if errors:
        p.error("; ".join(errors))
    return a


def workload_name(a):
    if a.preset == "minigpt" and all(getattr(a, k) == v for k, v in PRESETS["minigpt"].items()):
        shape = "minigpt"
    elif a.preset == "gpt2" and all(getattr(a, k) == v for k, v in PRESETS["gpt2"].items()):
        shape = "gpt2-124m"
    else:
        shape = f"v{a.vocab}-h{a.hidden}-nh{a.heads}-l{a.layers}-ffn{a.ffn}-ctx{a.context}"
    return f"{shape} b{a.batch}x{a.seq}"


def flops_per_step(a):
    """Model FLOPs of one step (forward + backward = 3x forward), PaLM's convention: every
    GEMM, attention counted over the full T x T (not halved for causality), no embeddings."""
    c, f, t, vp = a.hidden, a.ffn, a.seq, padded_vocab(a.vocab)
    per_token = a.layers * (2 * (3 * c * c + c * c + 2 * c * f) + 4 * t * c) + 2 * c * vp
    return 3 * per_token * a.batch * t


def write_rows(path, rows):
    """Writes benchmark rows as a JSON list (the form report.py merges)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=2)
        f.write("\n")


def git_commit():
    # The GPU machine gets a copy of the tree without .git: the caller passes the commit.
    if os.environ.get("BOULDER_COMMIT"):
        return os.environ["BOULDER_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loaded_blas(torch):
    """The BLAS torch's CPU GEMMs run on. Debian's build says BLAS_INFO=generic and links
    libblas.so.3, which the alternatives system points at OpenBLAS or at the (much slower)
    reference BLAS: the mapped file's real path tells which."""
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    if m and m.group(1) != "generic":
        return m.group(1)
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "libblas.so" in line}
    except OSError:
        return "unknown"
    if any("openblas" in lib for lib in libs):
        return "openblas"
    if any("/blas/" in lib for lib in libs):
        return "reference-blas"
    return ", ".join(sorted(libs)) or "unknown"


def build_model(torch, a):
    nn, F = torch.nn, torch.nn.functional
    vp = padded_vocab(a.vocab)
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(a.hidden)
            self.qkv = nn.Linear(a.hidden, 3 * a.hidden)
            self.proj = nn.Linear(a.hidden, a.hidden)
            self.ln2 = nn.LayerNorm(a.hidden)
            self.fc1 = nn.Linear(a.hidden, a.ffn)
            self.fc2 = nn.Linear(a.ffn, a.hidden)
            if sdpa is None:
                mask = torch.ones(a.context, a.context, dtype=torch.bool).tril()
                self.register_buffer("causal", mask, persistent=False)

        def attention(self, q, k, v):
            if sdpa is not None:
                return sdpa(q, k, v, is_causal=True)
            t = q.size(-2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            att = att.masked_fill(~self.causal[:t, :t], float("-inf"))
            return att.softmax(dim=-1) @ v

        def forward(self, x):
            b, t, c = x.shape
            nh = a.heads
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, nh, c // nh).transpose(1, 2) for z in (q, k, v))
            y = self.attention(q, k, v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vp, a.hidden)
            self.wpe = nn.Embedding(a.context, a.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.hidden)
            self.lm_head = nn.Linear(a.hidden, vp, bias=False)
            # Boulder's (GPT-2's) initialisation: N(0, 0.02), residual projections scaled by
            # 1/sqrt(2L), padding rows of the embedding and the head zero.
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln" in name or name.startswith("ln_f"):
                    nn.init.ones_(p)
                else:
                    std = 0.02
                    if name.endswith("proj.weight") or name.endswith("fc2.weight"):
                        std /= math.sqrt(2 * a.layers)
                    nn.init.normal_(p, mean=0.0, std=std)
            with torch.no_grad():
                self.wte.weight[a.vocab:].zero_()
                self.lm_head.weight[a.vocab:].zero_()

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = torch.arange(t, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            # Only the first V columns are real tokens: the padding never enters the softmax.
            logits = logits[..., : a.vocab].float()
            return F.cross_entropy(logits.reshape(-1, a.vocab), targets.reshape(-1))

    return GPT()


def arithmetic_batch(torch, a, gen):
    stride = torch.randint(1, a.max_stride + 1, (a.batch, 1), generator=gen)
    phase = torch.randint(0, a.vocab, (a.batch, 1), generator=gen)
    tokens = (phase + stride * torch.arange(a.seq + 1)) % a.vocab
    return tokens[:, :-1], tokens[:, 1:]


def main(argv):
    a = parse_args(argv)
    if a.threads is not None:
        # OpenBLAS sizes its own thread pool when it is loaded, apart from torch's OpenMP pool.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
        os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch

    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("pytorch_reference: --device cuda but torch.cuda.is_available() is False")
    if a.mode != "eager" and not hasattr(torch, "compile"):
        sys.exit(f"pytorch_reference: --mode {a.mode} needs torch.compile (PyTorch 2), "
                 f"this is {torch.__version__}")
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    model = build_model(torch, a).to(dev)
    params = [p for p in model.parameters()]
    opt_kwargs = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    if cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW(params, **opt_kwargs)
    step_model = model
    if a.mode == "compile":
        step_model = torch.compile(model)
    elif a.mode == "reduce-overhead":
        step_model = torch.compile(model, mode="reduce-overhead")
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if a.precision == "bf16":
        autocast = lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    gen = torch.Generator().manual_seed(a.seed)

    def next_batch():
        x, y = arithmetic_batch(torch, a, gen)
        if cuda:
            # Pinned + non_blocking: a pageable copy would synchronise the host every step.
            return (x.pin_memory().to(dev, non_blocking=True),
                    y.pin_memory().to(dev, non_blocking=True))
        return x, y

    def train_step():
        x, y = next_batch()
        if mark_step is not None and a.mode == "reduce-overhead":
            mark_step()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = step_model(x, y)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        return loss.detach()

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # Only the first and last losses are kept: a CUDA-graph replay overwrites the previous
    # step's outputs, so the first is copied out and the last is read before any replay.
    first_loss = last_loss = None
    times_ms = []
    if cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        events[0].record()
        for i in range(a.steps):
            last_loss = train_step()
            if i == 0:
                first_loss = last_loss.clone()
            events[i + 1].record()
        torch.cuda.synchronize()
        times_ms = [events[i].elapsed_time(events[i + 1]) for i in range(a.steps)]
        peak = torch.cuda.max_memory_allocated()
        device_name = torch.cuda.get_device_name()
    else:
        for i in range(a.steps):
            t0 = time.perf_counter()
            last_loss = train_step()
            times_ms.append((time.perf_counter() - t0) * 1e3)
            if i == 0:
                first_loss = last_loss
        # Linux reports ru_maxrss in KiB.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        device_name = "cpu: " + cpu_model()

    timed = times_ms[a.warmup:]
    ms = statistics.median(timed)
    tokens_per_s = a.batch * a.seq / (ms / 1e3)
    row = {
        "workload": a.workload or workload_name(a),
        "implementation": "pytorch-" + a.mode,
        "precision": a.precision,
        "gpu": device_name,
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(tokens_per_s, 1),
        "peak_memory_bytes": int(peak),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tflops_per_s": round(flops_per_step(a) / (ms / 1e3) / 1e12, 3),
        "timed_steps": len(timed),
        "final_loss": round(float(last_loss), 4),
        "framework": "torch " + torch.__version__,
    }
    if cuda:
        row["blas"] = "cublas"
    else:
        row["threads"] = torch.get_num_threads()
        row["blas"] = loaded_blas(torch)

    print(f"{row['implementation']} {a.precision} [{row['workload']}] on {device_name} "
          f"({row['framework']}, {row['blas']}): {ms:.2f} ms/step (median of {len(timed)}, "
          f"min {min(timed):.2f}, max {max(timed):.2f}), {tokens_per_s:,.0f} tokens/s, "
          f"{row['tflops_per_s']:.2f} TFLOP/s, peak {peak / 2**20:,.0f} MiB, "
          f"loss {float(first_loss):.4f} -> {float(last_loss):.4f}", flush=True)
    if a.json:
        write_rows(a.json, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
