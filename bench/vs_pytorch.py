#!/usr/bin/env python3
"""The peer of bench/vs_pytorch.sh: the project's MoE network written plainly in PyTorch eager, timed.

Subcommands (the driver calls them; docs/bench.md "Against PyTorch"):
  check                   exit 0 when torch imports, 1 otherwise (prints why)
  train CONFIG TOKENS     train the network of CONFIG on the token file of bench_tokens; one JSON line
  ours RUN_DIR -- CMD...  run CMD (moe train ... --run-dir RUN_DIR); the same JSON line from its metrics.jsonl
  summary RESULTS         the table and one last JSON line from the JSON lines of several runs

The network is docs/model.md's: byte embedding, pre-RMSNorm blocks of causal rotary attention and an MoE
FFN (softmax router, top-k, renormalised gates, SwiGLU experts, no capacity limit), load-balancing and z
losses, untied head; AdamW with decoupled decay (not on norm gains and the embedding), linear warm-up then
cosine decay to min_lr, global-norm clipping. Only the keys of the config that this network reads are
accepted; anything else the project could do (noise, capacity, shared experts...) is refused.
"""
import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import time

SIDES = ("ours", "pytorch")


def load_settings(path, steps):
    """The hyper-parameters of the config file, checked to be the ones this network implements."""
    with open(path) as f:
        c = json.load(f)
    tr, m, moe, opt = c["train"], c["model"], c["moe"], c["optim"]
    router, loss = moe.get("router", {}), moe.get("loss", {})
    unsupported = {
        "moe.every": moe.get("every", 1) != 1,
        "moe.shared_experts": moe.get("shared_experts", 0) != 0,
        "moe.capacity_factor > 0": moe.get("capacity_factor", 1.25) > 0,
        "moe.router.noise": router.get("noise", "none") != "none",
        "moe.router.score": router.get("score", "softmax") != "softmax",
        "moe.router.tau": router.get("tau", 1.0) != 1.0,
        "moe.router.normalize": not router.get("normalize", True),
        "moe.loss.entropy/death": loss.get("entropy", 0) != 0 or loss.get("death", 0) != 0,
        "train.micro_batch != global_batch": tr["micro_batch"] != tr["global_batch"],
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        sys.exit(f"vs_pytorch.py: {path}: not implemented on the PyTorch side: {', '.join(bad)}")
    return {
        "steps": steps or tr["steps"], "batch": tr["global_batch"], "seq_len": tr["seq_len"],
        "vocab": m["vocab"], "d_model": m["d_model"], "layers": m["layers"], "heads": m["heads"],
        "experts": moe["num_experts"], "top_k": moe["top_k"], "expert_hidden": moe["expert_hidden"],
        "aux": loss.get("aux", 0.01), "z": loss.get("z", 0.001),
        "lr": opt["lr"], "min_lr": opt["min_lr"], "warmup": opt["warmup"], "weight_decay": opt["weight_decay"],
        "betas": (opt.get("beta1", 0.9), opt.get("beta2", 0.95)), "eps": opt.get("eps", 1e-8),
        "clip": opt["clip"],
    }


def lr_at(s, step):
    """optim/adamw.cpp LrSchedule::at: linear warm-up, then cosine from lr to min_lr at the last step."""
    if s["warmup"] > 0 and step < s["warmup"]:
        return s["lr"] * (step + 1) / s["warmup"]
    decay_steps = s["steps"] - s["warmup"]
    if decay_steps <= 1:
        return s["lr"]
    progress = min(1.0, (step - s["warmup"]) / (decay_steps - 1))
    return s["min_lr"] + 0.5 * (s["lr"] - s["min_lr"]) * (1.0 + math.cos(math.pi * progress))


def build_model(s):
    """The network, as a PyTorch user would write it (torch imported here so that `check` needs nothing)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.gain

    def rotate(x, cos, sin):  # x: (B, T, H, Dh); rotates the pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))

        def forward(self, x, cos, sin, mask):
            B, T, D = x.shape
            shape = (B, T, self.heads, D // self.heads)
            q = rotate(self.wq(x).view(shape), cos, sin).transpose(1, 2)
            k = rotate(self.wk(x).view(shape), cos, sin).transpose(1, 2)
            v = self.wv(x).view(shape).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.heads)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            return self.wo((att @ v).transpose(1, 2).reshape(B, T, D))

    class Expert(nn.Module):
        def __init__(self, d, hidden):
            super().__init__()
            self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
            self.w2 = nn.Linear(hidden, d, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class MoE(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.router = nn.Linear(d, s["experts"], bias=False)
            self.experts = nn.ModuleList(Expert(d, s["expert_hidden"]) for _ in range(s["experts"]))

        def forward(self, x):  # x: (N, D), the whole batch is one routing group
            E, k = s["experts"], s["top_k"]
            logits = self.router(x)
            probs = logits.softmax(-1)
            weights, selected = probs.topk(k, dim=-1)
            weights = weights / weights.sum(-1, keepdim=True)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                token, slot = torch.where(selected == e)
                if token.numel() > 0:
                    y = expert(x.index_select(0, token)) * weights[token, slot, None]
                    out.index_add_(0, token, y)
            f = torch.bincount(selected.flatten(), minlength=E).float() / selected.numel()
            aux = s["aux"] * E * (f * probs.mean(0)).sum()
            z = s["z"] * torch.logsumexp(logits, -1).pow(2).mean()
            return out, aux + z

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.attn_norm, self.attn = RMSNorm(d), Attention(d, s["heads"])
            self.ffn_norm, self.ffn = RMSNorm(d), MoE(d)

        def forward(self, x, cos, sin, mask):
            x = x + self.attn(self.attn_norm(x), cos, sin, mask)
            y, router_loss = self.ffn(self.ffn_norm(x).view(-1, x.shape[-1]))
            return x + y.view(x.shape), router_loss

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            V, D, T = s["vocab"], s["d_model"], s["seq_len"]
            self.embed = nn.Embedding(V, D)
            self.blocks = nn.ModuleList(Block(D) for _ in range(s["layers"]))
            self.out_norm, self.head = RMSNorm(D), nn.Linear(D, V, bias=False)
            dh = D // s["heads"]
            angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (
                -torch.arange(0, dh, 2, dtype=torch.float64) / dh)
            self.register_buffer("cos", angle.cos().float()[:, None, :], persistent=False)  # (T, 1, Dh/2)
            self.register_buffer("sin", angle.sin().float()[:, None, :], persistent=False)
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

        def forward(self, tokens):  # tokens: (B, T)
            x = self.embed(tokens)
            router_loss = 0.0
            for block in self.blocks:
                x, r = block(x, self.cos, self.sin, self.mask)
                router_loss = router_loss + r
            return self.head(self.out_norm(x)), router_loss

    model = Net()
    out_std = 0.02 / math.sqrt(2 * s["layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("gain"):
                p.normal_(0.0, out_std if name.endswith(("wo.weight", "w2.weight")) else 0.02)
    return model


def make_optimizer(torch, model, s):
    decay = [p for n, p in model.named_parameters() if not (n.endswith("gain") or n.startswith("embed"))]
    keep = [p for n, p in model.named_parameters() if n.endswith("gain") or n.startswith("embed")]
    groups = [{"params": decay, "weight_decay": s["weight_decay"]}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s["lr"], betas=s["betas"], eps=s["eps"])


def train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    s = load_settings(args.config, args.steps)
    B, T = s["batch"], s["seq_len"]
    data = np.fromfile(args.tokens, dtype="<i4")
    if data.size < s["steps"] * B * (T + 1):
        sys.exit(f"vs_pytorch.py: {args.tokens} holds {data.size} tokens; {s['steps']} steps need "
                 f"{s['steps'] * B * (T + 1)}")
    data = torch.from_numpy(data[: s["steps"] * B * (T + 1)].astype(np.int64)).view(s["steps"], B, T + 1)
    model = build_model(s)
    opt = make_optimizer(torch, model, s)
    params = list(model.parameters())
    times, losses = [], []
    busy0, wall0, own0 = busy_cpu_s(), time.monotonic(), os.times()
    for step in range(s["steps"]):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits, router_loss = model(data[step, :, :-1])
        lm = F.cross_entropy(logits.reshape(-1, s["vocab"]), data[step, :, 1:].reshape(-1))
        (lm + router_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, s["clip"])
        for group in opt.param_groups:
            group["lr"] = lr_at(s, step)
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append({"step": step + 1, "lm_loss": lm.item(), "loss": (lm + router_loss).item()})
    own1 = os.times()
    own = own1.user + own1.system - own0.user - own0.system
    others = others_cores(busy_cpu_s() - busy0, own, time.monotonic() - wall0)
    step_s = statistics.median(times[args.warmup:])
    print(json.dumps({"side": "pytorch", "threads": args.threads, "tokens_per_s": B * T / step_s,
                      "step_ms": 1000 * step_s, "steps": s["steps"], "warmup": args.warmup,
                      "torch": torch.__version__, "others_cores": others, "losses": losses}))


def busy_cpu_s():
    """Busy CPU seconds of the whole machine, all cores: user + nice + system + irq + softirq + steal."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8)) / os.sysconf("SC_CLK_TCK")


def others_cores(machine_s, own_s, wall_s):
    """Cores that other processes took meanwhile: above ~0.1 the run was disturbed (docs/bench.md)."""
    return max(0.0, (machine_s - own_s) / wall_s) if wall_s > 0 else 0.0


def ours(args):
    """Runs `moe train` (the command after --) and reads its metrics.jsonl."""
    busy0, wall0 = busy_cpu_s(), time.monotonic()
    command = args.moe_train[1:] if args.moe_train[:1] == ["--"] else args.moe_train
    rc = subprocess.run(command, stdout=subprocess.DEVNULL).returncode
    if rc != 0:
        sys.exit(f"vs_pytorch.py: {' '.join(command)} exited {rc}")
    t = os.times()
    own = t.children_user + t.children_system
    others = others_cores(busy_cpu_s() - busy0, own, time.monotonic() - wall0)
    with open(os.path.join(args.run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if "tokens_per_s" in r]
    rates = [r["tokens_per_s"] for r in rows if r["step"] > args.warmup]
    if not rates:
        sys.exit(f"vs_pytorch.py: {args.run_dir}: no training step after the {args.warmup} warm-up steps")
    rate = statistics.median(rates)
    losses = [{"step": r["step"], "lm_loss": r["lm_loss"], "loss": r["loss"]} for r in rows]
    print(json.dumps({"side": "ours", "threads": args.threads, "tokens_per_s": rate,
                      "step_ms": 1000 * args.tokens_per_step / rate, "steps": rows[-1]["step"],
                      "warmup": args.warmup, "others_cores": others, "losses": losses}))


def throughput_table(runs, threads, tokens_per_step):
    """Per side and thread count the median over runs of each run's median tokens/s, printed."""
    med = {}
    print(f"{'side':<8} {'threads':>7} {'tokens/s':>9} {'step ms':>8}  {'others (max)':>12}  each run's tokens/s")
    for side in SIDES:
        for t in threads:
            mine = [r for r in runs if r["side"] == side and r["threads"] == t]
            med[side, t] = statistics.median(r["tokens_per_s"] for r in mine)
            others = max(r["others_cores"] for r in mine)
            each = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in mine)
            print(f"{side:<8} {t:>7} {med[side, t]:>9,.0f} {1000 * tokens_per_step / med[side, t]:>8.1f}  "
                  f"{others:>12.2f}  {each}")
    return med


def loss_table(runs, threads):
    """lm_loss at a few steps of the first run of each side, printed."""
    first = {side: next(r for r in runs if r["side"] == side and r["threads"] == threads[0]) for side in SIDES}
    steps = min(first[side]["steps"] for side in SIDES)
    shown = sorted({1, steps} | set(range(10, steps + 1, 10)))
    curves = {side: [next(x["lm_loss"] for x in first[side]["losses"] if x["step"] == st) for st in shown]
              for side in SIDES}
    print(f"lm_loss, first run of each side ({threads[0]} thread):")
    print(f"  {'step':>5} " + " ".join(f"{side:>8}" for side in SIDES))
    for i, st in enumerate(shown):
        print(f"  {st:>5} " + " ".join(f"{curves[side][i]:>8.3f}" for side in SIDES))
    return {"steps": shown, **curves}


def summary(args):
    with open(args.results) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    threads = sorted({r["threads"] for r in runs})
    med = throughput_table(runs, threads, args.tokens_per_step)
    best = {side: max(threads, key=lambda t: med[side, t]) for side in SIDES}
    ratio = med["ours", best["ours"]] / med["pytorch", best["pytorch"]]
    same = {str(t): med["ours", t] / med["pytorch", t] for t in threads}
    print("ours / pytorch at the same thread count: " + ", ".join(f"{t}t {v:.2f}x" for t, v in same.items()))
    print(f"ours at its best ({best['ours']}t) / pytorch at its best ({best['pytorch']}t): {ratio:.2f}x")
    curves = loss_table(runs, threads)
    print(json.dumps({"tokens_per_s": {side: {str(t): med[side, t] for t in threads} for side in SIDES},
                      "best_threads": best, "ratio_ours_best_to_pytorch_best": ratio,
                      "ratio_ours_to_pytorch_same_threads": same, "lm_loss": curves,
                      "others_cores_max": max(r["others_cores"] for r in runs), "runs": len(runs),
                      "load_average": {"start": args.load_start, "end": args.load_end},
                      "torch": next((r.get("torch") for r in runs if r["side"] == "pytorch"), None)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check")
    t = sub.add_parser("train")
    t.add_argument("config")
    t.add_argument("tokens")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--steps", type=int, default=0, help="0: train.steps of the config")
    t.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    t.add_argument("--seed", type=int, default=1234)
    o = sub.add_parser("ours")
    o.add_argument("run_dir")
    o.add_argument("--threads", type=int, required=True)
    o.add_argument("--warmup", type=int, default=5)
    o.add_argument("--tokens-per-step", type=int, required=True)
    o.add_argument("moe_train", nargs=argparse.REMAINDER, help="-- moe train ... --run-dir RUN_DIR")
    m = sub.add_parser("summary")
    m.add_argument("results")
    m.add_argument("--tokens-per-step", type=int, required=True)
    m.add_argument("--load-start", type=float)
    m.add_argument("--load-end", type=float)
    args = p.parse_args()
    if args.command == "check":
        try:
            importlib.import_module("torch")
        except ImportError as e:
            print(f"torch is not importable by {sys.executable}: {e}")
            sys.exit(1)
        return
    {"train": train, "ours": ours, "summary": summary}[args.command](args)


if __name__ == "__main__":
    main()
