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
        --cap, the page cache dropped before it, the --sides alternating
        for --rounds rounds; prints a table and whether the generated
        tokens are the same.

Sides (--sides, comma-separated; default smoe,offload):
    smoe        smoe.transformers, capped, with its lookahead (--lookahead,
                --lookahead-width)
    smoe-off    the same with lookahead=0
    offload     transformers + accelerate's disk offload, capped
--in-memory adds, once, uncapped: the model in memory (eager: the
yardstick), smoe with every expert in its ring (warmed by a first pass:
its compute alone) and the drive (the ring's reads alone: random experts
read through the streamer as fast as it can, capped).

The Python environment needs torch, transformers ≥ 5, safetensors,
the smoe package (`pip install './python[transformers]'`) and, for the
offload side, accelerate.
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
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    for side in sides:
        if side not in CAPPED_SIDES:
            die(f"--sides: {side!r} is not one of {', '.join(CAPPED_SIDES)}")
    print(
        f"model {model.name}: {weights / 2**30:.2f} GiB of weights; memory cap {cap / 2**30:.2f} GiB "
        f"({weights / cap:.2f}× smaller); {args.tokens} tokens greedy after a {args.prompt_tokens}-token "
        f"prompt; torch threads {args.threads}; {args.rounds} rounds of {', '.join(sides)}, alternating; "
        f"smoe lookahead {args.lookahead} layers × {args.lookahead_width or 'top-k'} experts a token, "
        f"workers {args.workers or 'as the library chooses'}; "
        f"accelerate with experts_implementation={args.offload_experts!r}",
        flush=True,
    )
    results: dict[str, list[dict]] = {side: [] for side in (*CAPPED_SIDES, *UNCAPPED_SIDES)}
    plan = [(r, mode) for r in range(args.rounds) for mode in sides]
    if args.in_memory:
        # The yardsticks, uncapped: the model in memory (compute alone);
        # smoe with every expert resident (its compute alone); the drive
        # (capped: the reads alone).
        plan += [(0, "memory"), (0, "resident"), (0, "drive")]
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
                "--lookahead",
                str(0 if mode == "smoe-off" else args.lookahead),
                "--lookahead-width",
                str(args.lookahead_width),
                "--workers",
                str(args.workers),
            ]
            start = time.monotonic()
            join = None if mode in ("memory", "resident") else group.join
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
            if mode == "drive":
                print(
                    f"drive: {result['bytes'] / 2**30:.2f} GiB of random experts in {result['seconds']:.2f} s: "
                    f"{result['bytes'] / result['seconds'] / 1e9:.2f} GB/s through the streamer",
                    flush=True,
                )
                continue
            print(
                f"round {round_ + 1} {mode:8} {result['tokens_per_s']:7.3f} tokens/s, first token "
                f"{result['first_token_s']:6.2f} s, load {result['load_s']:6.2f} s, read "
                f"{result['read_bytes'] / 2**30:6.2f} GiB during decode, peak {result['peak'] / 2**30:.2f} GiB"
                + (f"; {prediction(result['decode'])}" if result.get("decode") else ""),
                flush=True,
            )
    finally:
        if group is not None:
            group.remove()
    table(results, args)


CAPPED_SIDES = ("smoe", "smoe-off", "offload")
UNCAPPED_SIDES = ("memory", "resident", "drive")
NAMES = {
    "smoe": "`smoe.transformers`, lookahead",
    "smoe-off": "`smoe.transformers`, no lookahead",
    "offload": "transformers + accelerate disk offload",
    "memory": "in memory, no cap (eager; compute alone)",
    "resident": "smoe, every expert in the ring, no cap (its compute alone)",
}


def prediction(d: dict) -> str:
    """The decode's lookahead figures: recall, bets wasted, drive idle."""
    parts = []
    if d["prediction_routed"]:
        parts.append(f"recall {d['prediction_hits'] / d['prediction_routed']:.1%}")
    if d["bytes_read"]:
        parts.append(
            f"speculative {d['bytes_speculative'] / d['bytes_read']:.0%} of the bytes read, "
            f"unclaimed {d['bytes_speculative_unclaimed'] / d['bytes_read']:.1%}"
        )
    if d["busy_ns"]:
        parts.append(f"drive idle {d['drive_idle_ns'] / d['busy_ns']:.0%} of the busy time")
    return ", ".join(parts)


def table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    memory = results["memory"]
    print()
    print("| | tokens/s (median) | ÷ in memory | first token | load | read per token | peak memory |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for side in (*CAPPED_SIDES, "memory", "resident"):
        rows = results[side]
        if not rows:
            continue
        per_token = med(rows, "read_bytes") / max(1, args.tokens - 1)
        ratio = f"{med(rows, 'tokens_per_s') / memory[0]['tokens_per_s']:.2f}" if memory else "-"
        peak = f"{med(rows, 'peak') / 2**30:.2f} GiB" + (" (not capped)" if side in UNCAPPED_SIDES else "")
        print(
            f"| {NAMES[side]} | {med(rows, 'tokens_per_s'):.3f} | {ratio} | {med(rows, 'first_token_s'):.2f} s | "
            f"{med(rows, 'load_s'):.2f} s | {per_token / 2**20:.0f} MiB | {peak} |"
        )
    print()
    for side in ("smoe", "smoe-off"):
        for i, r in enumerate(results[side]):
            if r.get("decode"):
                print(f"{side} round {i + 1}: decode {prediction(r['decode'])}")
    for a, b in (("smoe", "smoe-off"), ("smoe", "offload"), ("smoe-off", "offload")):
        if results[a] and results[b]:
            ratios = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(results[a], results[b])]
            print(f"{a} ÷ {b}, round by round: " + ", ".join(f"{r:.2f}" for r in ratios))
    drive = results["drive"]
    if drive and results["smoe"]:
        rate = drive[0]["bytes"] / drive[0]["seconds"]
        smoe_read = med(results["smoe"], "smoe_read_bytes") / max(1, args.tokens - 1)
        print(
            f"reads alone: {smoe_read / 2**20:.0f} MiB a token (smoe with lookahead, median) at the "
            f"drive's {rate / 1e9:.2f} GB/s through the streamer: {smoe_read / rate * 1000:.0f} ms a token"
        )
    for side in ("memory", "resident"):
        if results[side]:
            print(f"{side}: {1000 / results[side][0]['tokens_per_s']:.0f} ms a token")
    timed = [r for side in (*CAPPED_SIDES, "memory", "resident") for r in results[side]]
    same = all(r["tokens"] == timed[0]["tokens"] for r in timed)
    print(f"tokens: {'identical' if same else 'DIFFER'} ({timed[0]['tokens']})")
    if not same:
        for side in (*CAPPED_SIDES, "memory", "resident"):
            print(f"{side}: {[r['tokens'] for r in results[side]]}")
    for side in ("smoe", "smoe-off"):
        stats = results[side][-1].get("smoe") if results[side] else None
        if stats:
            print(
                f"{side}: ring {stats['ring_slots']} slots × {stats['slot_bytes'] / 2**20:.2f} MiB, "
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
    if args.mode == "drive":
        drive(args)
        return
    t0 = time.monotonic()
    if args.mode in ("smoe", "smoe-off", "resident"):
        import smoe.transformers

        # The ring: what the weights may take beside the dense ones; for
        # "resident", every expert.
        with smoe.Streamer(model_dir, ring_slots=1, prewarm=False, freq_path="") as probe:
            slot = probe.stats()["slot_bytes"]
            experts = expert_count(probe)
        if args.mode == "resident":
            slots = experts
        else:
            slots = max(1, (args.weights_memory - dense_bytes(model_dir)) // slot)
        keywords = {"lookahead": args.lookahead, "workers": args.workers}
        if args.lookahead_width:
            keywords["lookahead_width"] = args.lookahead_width
        model = smoe.transformers.from_pretrained(
            model_dir, ring_slots=slots, prewarm=False, freq_path="", dtype=torch.bfloat16, **keywords
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
    streamer = getattr(model, "smoe_streamer", None)
    stamps: list[float] = []
    io_start: list[int] = []
    stats_start: list[dict] = []

    class Stamp(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.monotonic())
            if len(stamps) == 1:
                io_start.append(read_bytes())
                if streamer is not None:
                    stats_start.append(streamer.stats())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def generate():
        with torch.no_grad():
            return model.generate(
                ids,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                do_sample=False,
                stopping_criteria=transformers.StoppingCriteriaList([Stamp()]),
            )

    if args.mode == "resident":
        # A first pass loads the experts the tokens route to; the second,
        # timed, finds every one of them in the ring.
        generate()
        stamps.clear(), io_start.clear(), stats_start.clear()
    t1 = time.monotonic()
    out = generate()
    decode_read = read_bytes() - io_start[0]
    result = {
        "load_s": load,
        "first_token_s": stamps[0] - t1,
        "tokens_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "read_bytes": decode_read,
        "tokens": out[0, args.prompt_tokens :].tolist(),
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if streamer is not None:
        end = streamer.stats()
        result["smoe"] = end
        # The decode's own counters (the prompt routes most experts of a
        # layer: no lookahead there).
        decode = {k: end[k] - stats_start[0][k] for k in DECODE_COUNTERS}
        # Unclaimed bets of the whole run: the prompt makes none.
        decode["bytes_speculative_unclaimed"] = end["bytes_speculative_unclaimed"]
        result["decode"] = decode
        result["smoe_read_bytes"] = decode["bytes_read"]
        streamer.close()
    print(json.dumps(result))


DECODE_COUNTERS = (
    "bytes_read",
    "claims",
    "hits",
    "bytes_speculative",
    "prediction_routed",
    "prediction_hits",
    "speculative_dropped",
    "busy_ns",
    "drive_idle_ns",
)


def expert_count(streamer) -> int:
    """Every (layer, expert) of the streamer's model."""
    count = 0
    for layer in streamer.metadata["layer_blob_layouts"]:
        expert = 0
        while True:
            try:
                streamer.expert_info(int(layer), expert)
            except Exception:  # smoe.NotFound: past the layer's last
                break
            expert += 1
        count += expert
    return count


def drive(args: argparse.Namespace) -> None:
    """The reads alone: random experts (seeded; each read once) through a
    streamer with the smoe side's ring, a layer's set at a time as the
    backend hands them over, claimed and released at once."""
    import random

    import smoe

    model_dir = pathlib.Path(args.dir)
    with smoe.Streamer(model_dir, ring_slots=1, prewarm=False, freq_path="") as probe:
        slot = probe.stats()["slot_bytes"]
        layers = sorted(int(layer) for layer in probe.metadata["layer_blob_layouts"])
        experts = expert_count(probe) // len(layers)
    slots = max(1, (args.weights_memory - dense_bytes(model_dir)) // slot)
    picks = random.Random(5).sample([(layer, e) for layer in layers for e in range(experts)], 512)
    by_layer: dict[int, list[int]] = {}
    for layer, expert in picks:
        by_layer.setdefault(layer, []).append(expert)
    with smoe.Streamer(model_dir, ring_slots=slots, prewarm=False, freq_path="", workers=args.workers) as s:
        start = time.monotonic()
        for layer, todo in by_layer.items():
            s.prefetch_set(layer, todo)
            while todo:
                with s.claim_any(layer, todo, timeout=60) as lease:
                    todo.remove(lease.expert)
        seconds = time.monotonic() - start
        print(json.dumps({"bytes": s.stats()["bytes_read"], "seconds": seconds, "reads": len(picks)}))


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
    r.add_argument(
        "--in-memory",
        action="store_true",
        help="also time, once: the model in memory and smoe with every expert resident (both "
        "uncapped), and the drive through the streamer (capped)",
    )
    r.add_argument("--sides", default="smoe,offload", help="what is timed, alternating: " + ", ".join(CAPPED_SIDES))
    r.add_argument("--lookahead", type=int, default=1, help="the smoe side's lookahead (layers ahead; smoe-off: 0)")
    r.add_argument(
        "--lookahead-width", type=int, default=0, help="experts a token each guess takes (0: the model's top-k)"
    )
    r.add_argument("--workers", type=int, default=0, help="smoe's I/O workers (0: the library's choice)")
    r.add_argument("--tokens", type=int, default=8)
    r.add_argument("--prompt-tokens", type=int, default=16)
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    c = sub.add_parser("_child")
    c.add_argument("mode", choices=[*CAPPED_SIDES, *UNCAPPED_SIDES])
    c.add_argument("dir")
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--prompt-tokens", type=int, required=True)
    c.add_argument("--threads", type=int, required=True)
    c.add_argument("--weights-memory", type=int, required=True)
    c.add_argument("--offload-experts", required=True)
    c.add_argument("--offload-dir", required=True)
    c.add_argument("--lookahead", type=int, required=True)
    c.add_argument("--lookahead-width", type=int, required=True)
    c.add_argument("--workers", type=int, required=True)
    args = parser.parse_args()
    {"make": make, "run": run, "_child": child}[args.command](args)


if __name__ == "__main__":
    main()
