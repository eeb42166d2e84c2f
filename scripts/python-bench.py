#!/usr/bin/env python3
"""Decode speed of a transformers MoE model larger than memory: smoe's
backend (`smoe.transformers.from_pretrained`, experts streamed from the
checkpoint) against transformers with accelerate's disk offload
(`device_map="auto"`, `max_memory`, `offload_folder`), the figure a user
gets without smoe. docs/python.md ("Measured") quotes its output.

    python-bench.py make DIR [--layers 16 --experts 64 ...]
        writes a random-weight Qwen3-MoE checkpoint (bf16) with
        save_pretrained: no network, no downloaded weights.
    python-bench.py run DIR --cap 1400M [--tokens 8 --rounds 2 ...]
        as root: each run in a memory cgroup (v2, else v1) capped at
        --cap, the page cache dropped before it, smoe and accelerate
        alternating for --rounds rounds; prints a table and whether the
        generated tokens are the same.

The Python environment needs torch, transformers ≥ 5, safetensors,
accelerate and the smoe package (`pip install './python[transformers]'
accelerate`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CGROUP_NAME = "smoe-python-bench"


def die(message: str) -> None:
    print(f"python-bench: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- make


def make(args: argparse.Namespace) -> None:
    import torch
    import transformers

    out = pathlib.Path(args.dir)
    if out.exists() and any(out.iterdir()):
        die(f"{out} exists and is not empty: give a new directory")
    config = transformers.Qwen3MoeConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        moe_intermediate_size=args.ff,
        num_hidden_layers=args.layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=args.hidden // 16,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(args.seed)
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # Routers drawn wider than the init's 0.02: scores that are not all
    # alike, so each token picks its experts as a trained model's would
    # (still broad: random weights have no favourites).
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 1.0)
    model.save_pretrained(out, max_shard_size="2GB")
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"wrote {out}: {size / 2**30:.2f} GiB of safetensors, {args.layers} layers × {args.experts} experts, top-{args.top_k}")


# ---------------------------------------------------------------- the cgroup


class Cgroup:
    """A memory cgroup capped at `cap` bytes: v2 at /sys/fs/cgroup, else v1
    under this process's own memory cgroup."""

    def __init__(self, cap: int, name: str):
        root = pathlib.Path("/sys/fs/cgroup")
        if (root / "cgroup.controllers").is_file():
            if "memory" not in (root / "cgroup.controllers").read_text().split():
                die("the cgroup v2 memory controller is not available")
            self.path = root / name
            self.v2 = True
        elif (root / "memory").is_dir():
            own = next(
                line.split(":", 2)[2].strip()
                for line in open("/proc/self/cgroup")
                if line.split(":")[1] == "memory"
            )
            self.path = root / "memory" / own.lstrip("/") / name
            self.v2 = False
        else:
            die("no memory cgroup (v2 at /sys/fs/cgroup, or v1 at /sys/fs/cgroup/memory)")
        self.path.mkdir(exist_ok=True)
        try:
            self._limit(root, cap)
        except BaseException:
            self.remove()
            raise

    def _limit(self, root: pathlib.Path, cap: int) -> None:
        if self.v2:
            try:
                (root / "cgroup.subtree_control").write_text("+memory")
            except OSError:
                pass
            (self.path / "memory.max").write_text(str(cap))
            try:
                (self.path / "memory.swap.max").write_text("0")
            except OSError:
                pass
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(cap))

    def reset_peak(self) -> None:
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except OSError:
            return 0

    def join(self) -> None:
        """Moves the calling process into the cgroup (a child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        # A cgroup whose last process has just exited may be busy a moment.
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"python-bench: could not remove {self.path}", file=sys.stderr)


# ---------------------------------------------------------------- run


def drop_caches() -> None:
    os.sync()
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")


def run(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        die("run as root (a memory cgroup, drop_caches)")
    model = pathlib.Path(args.dir).resolve()
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    if weights == 0:
        die(f"{model}: no safetensors files (python-bench.py make {model})")
    cap = parse_size(args.cap)
    print(
        f"model {model.name}: {weights / 2**30:.2f} GiB of weights; memory cap {cap / 2**30:.2f} GiB "
        f"({weights / cap:.2f}× smaller); {args.tokens} tokens greedy after a {args.prompt_tokens}-token "
        f"prompt; torch threads {args.threads}; {args.rounds} rounds, alternating; accelerate with "
        f"experts_implementation={args.offload_experts!r}",
        flush=True,
    )
    results: dict[str, list[dict]] = {"smoe": [], "offload": [], "memory": []}
    plan = [(r, mode) for r in range(args.rounds) for mode in ("smoe", "offload")]
    if args.in_memory:
        # The yardstick: the model in memory (no cap), compute alone.
        plan.append((0, "memory"))
    group = None
    try:
        for round_, mode in plan:
            drop_caches()
            # A fresh cgroup a run: v2's memory.peak cannot be reset, and
            # would carry the last run's peak.
            group = Cgroup(cap, f"{CGROUP_NAME}-{os.getpid()}-{round_}-{mode}")
            group.reset_peak()
            child = [
                sys.executable,
                os.path.abspath(__file__),
                "_child",
                mode,
                str(model),
                "--tokens",
                str(args.tokens),
                "--prompt-tokens",
                str(args.prompt_tokens),
                "--threads",
                str(args.threads),
                "--weights-memory",
                str(parse_size(args.weights_memory)),
                "--offload-experts",
                args.offload_experts,
                "--offload-dir",
                args.offload_dir,
            ]
            start = time.monotonic()
            join = None if mode == "memory" else group.join
            done = subprocess.run(child, capture_output=True, text=True, preexec_fn=join)
            wall = time.monotonic() - start
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                die(f"round {round_ + 1} {mode}: exit {done.returncode} (an OOM kill is -9)")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            # Outside the cgroup, the process's own peak resident set.
            result["peak"] = group.peak() if join else result["max_rss"]
            group.remove()
            result["wall"] = wall
            results[mode].append(result)
            print(
                f"round {round_ + 1} {mode:8} {result['tokens_per_s']:7.3f} tokens/s, first token "
                f"{result['first_token_s']:6.2f} s, load {result['load_s']:6.2f} s, read "
                f"{result['read_bytes'] / 2**30:6.2f} GiB during decode, peak {result['peak'] / 2**30:.2f} GiB",
                flush=True,
            )
    finally:
        if group is not None:
            group.remove()
    table(results, args)


def table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    smoe, offload = results["smoe"], results["offload"]
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    print()
    print("| | tokens/s (median) | first token | load | read per token | peak memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rows in (("smoe.transformers", smoe), ("accelerate disk offload", offload)):
        per_token = med(rows, "read_bytes") / max(1, args.tokens - 1)
        print(
            f"| {name} | {med(rows, 'tokens_per_s'):.3f} | {med(rows, 'first_token_s'):.2f} s | "
            f"{med(rows, 'load_s'):.2f} s | {per_token / 2**20:.0f} MiB | {med(rows, 'peak') / 2**30:.2f} GiB |"
        )
    memory = results["memory"]
    if memory:
        m = memory[0]
        print(
            f"| in memory, no cap (eager; compute alone) | {m['tokens_per_s']:.3f} | {m['first_token_s']:.2f} s | "
            f"{m['load_s']:.2f} s | {m['read_bytes'] / max(1, args.tokens - 1) / 2**20:.0f} MiB | {m['peak'] / 2**30:.2f} GiB (not capped) |"
        )
    ratios = [s["tokens_per_s"] / o["tokens_per_s"] for s, o in zip(smoe, offload)]
    print()
    print("smoe ÷ offload, round by round: " + ", ".join(f"{r:.2f}" for r in ratios))
    if memory:
        print(f"smoe ÷ in memory: {med(smoe, 'tokens_per_s') / memory[0]['tokens_per_s']:.2f}")
    same = all(r["tokens"] == smoe[0]["tokens"] for r in smoe + offload + memory)
    print(f"tokens: {'identical' if same else 'DIFFER'} ({smoe[0]['tokens']})")
    if not same:
        print(f"accelerate's: {[r['tokens'] for r in offload]}; in memory: {[r['tokens'] for r in memory]}")
    stats = smoe[-1].get("smoe")
    if stats:
        print(
            f"smoe: ring {stats['ring_slots']} slots × {stats['slot_bytes'] / 2**20:.2f} MiB, "
            f"claims {stats['claims']}, hits {stats['hits']}, bytes read {stats['bytes_read'] / 2**30:.2f} GiB"
        )


def parse_size(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    suffix = text[-1] if text and text[-1] in units else ""
    return int(float(text[: len(text) - len(suffix)]) * units[suffix])


# ---------------------------------------------------------------- one run


def child(args: argparse.Namespace) -> None:
    cleanup: list[str] = []
    try:
        one_run(args, cleanup)
    finally:
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)


def one_run(args: argparse.Namespace, cleanup: list[str]) -> None:
    import torch

    torch.set_num_threads(args.threads)
    import transformers

    model_dir = pathlib.Path(args.dir)
    t0 = time.monotonic()
    if args.mode == "smoe":
        import smoe.transformers

        # The ring: what the weights may take beside the dense ones.
        dense = dense_bytes(model_dir)
        with smoe.Streamer(model_dir, ring_slots=1, prewarm=False, freq_path="") as probe:
            slot = probe.stats()["slot_bytes"]
        slots = max(1, (args.weights_memory - dense) // slot)
        model = smoe.transformers.from_pretrained(
            model_dir, ring_slots=slots, prewarm=False, freq_path="", dtype=torch.bfloat16
        )
    elif args.mode == "memory":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, experts_implementation="eager"
        )
    else:
        # accelerate writes the weights it offloads there (as .dat files):
        # removed when this run ends.
        offload = tempfile.mkdtemp(prefix="smoe-bench-offload-", dir=args.offload_dir)
        cleanup.append(offload)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=torch.bfloat16,
            device_map="auto",
            max_memory={"cpu": args.weights_memory},
            offload_folder=offload,
            experts_implementation=args.offload_experts,
        )
    load = time.monotonic() - t0
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(3, model.config.vocab_size, (1, args.prompt_tokens), generator=generator)
    stamps: list[float] = []
    io_start: list[int] = []

    class Stamp(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.monotonic())
            if len(stamps) == 1:
                io_start.append(read_bytes())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    t1 = time.monotonic()
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=args.tokens,
            min_new_tokens=args.tokens,
            do_sample=False,
            stopping_criteria=transformers.StoppingCriteriaList([Stamp()]),
        )
    decode_read = read_bytes() - io_start[0]
    result = {
        "load_s": load,
        "first_token_s": stamps[0] - t1,
        "tokens_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "read_bytes": decode_read,
        "tokens": out[0, args.prompt_tokens :].tolist(),
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if args.mode == "smoe":
        result["smoe"] = model.smoe_streamer.stats()
        model.smoe_streamer.close()
    print(json.dumps(result))


def read_bytes() -> int:
    """Bytes this process caused to be read from storage (page faults too)."""
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def dense_bytes(model_dir: pathlib.Path) -> int:
    """The bytes of the checkpoint's tensors that are not routed experts."""
    from safetensors import safe_open

    total = 0
    for file in model_dir.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                if ".mlp.experts." in key:
                    continue
                piece = f.get_slice(key)
                n = 1
                for d in piece.get_shape():
                    n *= d
                total += n * 2
    return total


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write a random-weight Qwen3-MoE checkpoint")
    m.add_argument("dir")
    m.add_argument("--layers", type=int, default=16)
    m.add_argument("--experts", type=int, default=64)
    m.add_argument("--top-k", type=int, default=8)
    m.add_argument("--hidden", type=int, default=1024)
    m.add_argument("--ff", type=int, default=512, help="each expert's intermediate size")
    m.add_argument("--vocab", type=int, default=32000)
    m.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="time smoe against accelerate's disk offload, capped")
    r.add_argument("dir")
    r.add_argument("--cap", default="1400M", help="memory.max of the cgroup")
    r.add_argument(
        "--weights-memory",
        default="600M",
        help="memory each may give the weights (smoe: dense weights + ring; accelerate: max_memory['cpu'])",
    )
    r.add_argument(
        "--offload-experts",
        default="eager",
        help="accelerate's run: transformers' experts_implementation (eager: smoe's logits are "
        "eager's bit for bit, so the tokens must match; grouped_mm, batched_mm: other sums)",
    )
    r.add_argument(
        "--offload-dir",
        default=tempfile.gettempdir(),
        help="where accelerate's offload folder is made (not a tmpfs: that would be memory)",
    )
    r.add_argument("--in-memory", action="store_true", help="also time the model in memory, uncapped")
    r.add_argument("--tokens", type=int, default=8)
    r.add_argument("--prompt-tokens", type=int, default=16)
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    c = sub.add_parser("_child")
    c.add_argument("mode", choices=["smoe", "offload", "memory"])
    c.add_argument("dir")
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--prompt-tokens", type=int, required=True)
    c.add_argument("--threads", type=int, required=True)
    c.add_argument("--weights-memory", type=int, required=True)
    c.add_argument("--offload-experts", required=True)
    c.add_argument("--offload-dir", required=True)
    args = parser.parse_args()
    {"make": make, "run": run, "_child": child}[args.command](args)


if __name__ == "__main__":
    main()
