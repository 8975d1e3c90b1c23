"""Tensor and data parallelism on two GPUs (issue 59): the engine with tensor_parallel_size=2
(NCCL, one process a GPU) against one GPU on the same random-weight models, and two data-
parallel replicas serving one request stream against one replica.

Phases (each one or more processes started here with `torch.multiprocessing`, one a GPU; the
phases run one after the other and write their JSON into a work folder):
- "single" (1 process, GPU 0, no process group) and "tp" (`--world` processes, NCCL, the
  engine's `tensor_parallel_size=world`), each for every model of `MODELS` (`random_model.py`:
  the same weights on every rank and in the one-GPU model, drawn from (seed, tensor name)):
  - check: `CHECK_PROMPTS` greedy requests (seeded lengths in [8, 300], `CHECK_NEW` tokens),
    the top-2 logits of every sampled row recorded (a tap on the runner);
  - speed: `bench_model.serve` of b requests of a 512-token prompt, b in `SPEED_BATCHES`,
    decode steps timed with CUDA graphs (the TP graphs capture the all-reduces; gpt-oss's
    experts are grouped matmuls), the graph replay alone, and a profile of the b64 replay
    (rank 0's; the all-reduce share is that of the `nccl` kernels); skipped with
    `--share-gpu`;
  - "tp" also times NCCL all-reduces: the messages of a decode step (b x hidden bf16) and 256
    MiB (the bandwidth: bytes / time, NCCL's "algorithm bandwidth"), and the copy bandwidth
    of each GPU.
- "stream" (1 process, GPU 0) serves the request stream of `stream()` (`STREAM_REQUESTS`
  requests, lognormal prompt and output lengths, seeded; the Llama shape) on one engine;
  "dp" (`--world` processes, each a whole engine on its GPU; gloo only for a barrier)
  dispatches it up front to the replica with the fewest assigned tokens (prompt + output);
  throughput = generated tokens / the slower replica's wall time, from a common start.

Then (`merge`): tokens of "tp" against "single" per model, equal up to the first near-tie: at
a request's first differing token, the one-GPU run's top-2 logit gap must be within
`TIE_FACTOR` x the largest top-1 logit difference of the two runs on the common prefix (the
rounding noise that tensor parallelism's reordered sums bring, measured in the same run);
the same check with the models in float32 (same weights; its noise, ~1e-6 of a logit, cannot
flip a token that is not an exact tie; bf16 logits of a random 8B model often tie outright);
the step times against one GPU; and the two-GPU roofline of a decode step: (half the
weights + half the KV) per GPU over the copy bandwidth, plus the all-reduce bytes (2 a layer,
b x hidden x 2 bytes each) over the measured all-reduce bandwidth.

Usage:
  python bench/bench_tp.py [--world 2] [--phases single,tp,dp] [--only llama] [--out P.json]
  python bench/bench_tp.py --world 1      # the same script on one GPU (a world of one)
  python bench/bench_tp.py --share-gpu --phases single,tp   # 2 ranks on 1 GPU: gloo, eager,
                                          # each rank's shard checked on the GPU (no speeds)
  python bench/bench_tp.py --dry-run      # CPU: gloo, 2 processes, tiny shapes, no timing claims
  python bench/bench_tp.py --work DIR --phases ""   # merge phases run earlier into DIR
Output: JSON (`common.save`, suite "tp"), a PNG beside it and a short table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_model as bm
from common import Record, copy_bandwidth, environment, git_commit, save
from random_model import random_model

from pagedattn.engine import LLMEngine, SamplingParams
from pagedattn.ops.launch import jit_compiles

SUITE = "tp"
SEED = 0
CHECK_PROMPTS = 16
CHECK_NEW = 32
TIE_FACTOR = 4.0
SPEED_BATCHES = (64, 256)
STREAM_REQUESTS = 512
STREAM_WARMUP = 256
ALLREDUCE_BIG = 256 * 2**20
NCCL_REPS = 50
PHASES = ("single", "tp", "stream", "dp")

LLAMA = dict(
    bm.SHAPES["llama3-8b"], architectures=["LlamaForCausalLM"], model_type="llama",
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)  # fmt: skip
GPT_OSS = dict(
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    architectures=["GptOssForCausalLM"],
    model_type="gpt_oss",
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)  # fmt: skip  (gpt-oss-20b's shape)
MODELS = {"llama3-8b": LLAMA, "gpt-oss-20b": GPT_OSS}
DRY = dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=8, num_key_value_heads=2, head_dim=16)  # fmt: skip
DRY_MOE = dict(DRY, num_local_experts=4, num_experts_per_tok=2, sliding_window=8)


def model_dict(name: str, dry: bool) -> dict:
    d = MODELS[name]
    return d | (DRY_MOE if "gpt" in name else DRY) if dry else d


# --- one process ------------------------------------------------------------------------------


class Proc:
    """This process's rank, world, device, dtype and what it writes."""

    def __init__(self, rank: int, world: int, phase: str, dry: bool, work: str) -> None:
        self.rank, self.world, self.phase, self.dry, self.work = rank, world, phase, dry, work
        self.shared = False
        self.tp = world if phase == "tp" else 1
        if dry:
            self.dev = torch.device("cpu")
            self.dtype = torch.float32
        else:
            gpus = torch.cuda.device_count()
            # More ranks than GPUs (`--share-gpu`): ranks share GPUs over gloo, eagerly, to
            # check each rank's shard on the GPU; no speed claims then.
            self.shared = world > gpus
            torch.cuda.set_device(rank % gpus)
            self.dev = torch.device("cuda", rank % gpus)
            self.dtype = torch.bfloat16
        self.out: dict = {"phase": phase, "rank": rank, "world": world, "models": {}}

    def sync(self) -> None:
        if not self.dry:
            torch.cuda.synchronize()

    def barrier(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if dist.is_initialized():
            dist.barrier()

    def free(self) -> None:
        import gc  # noqa: PLC0415

        gc.collect()
        if not self.dry:
            torch.cuda.empty_cache()


def _init_group(p: Proc) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    if p.phase in ("single", "stream") or p.world == 1 and p.phase == "dp":
        return
    init = "file://" + os.path.join(p.work, f"rendezvous-{p.phase}")
    if p.phase == "tp" and not p.dry and not p.shared:
        dist.init_process_group("nccl", init_method=init, rank=p.rank, world_size=p.world,
                                device_id=p.dev)  # fmt: skip
    else:  # dp: a barrier only; the dry run's TP over gloo
        dist.init_process_group("gloo", init_method=init, rank=p.rank, world_size=p.world)


def worker(rank: int, world: int, phase: str, dry: bool, work: str, only: str | None) -> None:
    p = Proc(rank, world, phase, dry, work)
    if dry:
        torch.set_num_threads(1)
    p.out["env"] = dict(environment(probe_flashinfer=False), commit=git_commit(),
                        gpus=0 if dry else torch.cuda.device_count())  # fmt: skip
    _init_group(p)
    try:
        if phase in ("stream", "dp"):  # the whole stream on one replica, or this one's share
            part = rank if phase == "dp" else None
            p.out["stream"] = serve_stream(p, model_dict("llama3-8b", dry), part=part)
        else:
            if phase == "tp":
                p.out["nccl"] = nccl_times(p) if not p.shared else {}
            for name in MODELS:
                if only and only not in name:
                    continue
                p.out["models"][name] = run_model(p, name)
        with open(os.path.join(work, f"{phase}-rank{rank}.json"), "w") as f:
            json.dump(p.out, f)
        p.barrier()  # every rank past its last collective before any closes the group
    finally:
        import torch.distributed as dist  # noqa: PLC0415

        if dist.is_initialized():
            dist.destroy_process_group()


def run_model(p: Proc, name: str) -> dict:
    cfg = model_dict(name, p.dry)
    t0 = time.perf_counter()
    model = random_model(cfg, p.dev, p.dtype, SEED, tp_size=p.tp)
    p.sync()
    res: dict = {"build_s": round(time.perf_counter() - t0, 2)}
    res["check"] = check_tokens(p, model)
    p.free()
    res["speed"] = {}
    for b in () if p.shared else SPEED_BATCHES:  # ranks sharing a GPU: shard checks only
        res["speed"][str(b)] = speed(p, model, b, graphs=True, profile=b == SPEED_BATCHES[0])
        p.free()
    bm_cost = bm.step_cost  # bytes of this process's shard (replicated parts in full)
    res["param_bytes"] = bm_cost(model, 1, 0.0)["param_bytes"]
    del model
    p.free()
    if not p.dry:  # the same weights in float32: rounding noise ~1e-6, far below any gap
        model = random_model(cfg, p.dev, torch.float32, SEED, tp_size=p.tp)
        res["check_float32"] = check_tokens(p, model)
        del model
        p.free()
    return res


class LogitTap:
    """Wraps an engine's `runner.execute`: the (argmax, top-1, top-2 logit) of every sampled
    row, per request id, in order."""

    def __init__(self, eng: LLMEngine) -> None:
        self.rows: dict[int, list[tuple[int, float, float]]] = {}
        run = eng.runner.execute

        def execute(inputs):
            logits = run(inputs)
            top = logits.float().topk(2, dim=-1)
            vals, idx = top.values.cpu().tolist(), top.indices[:, 0].cpu().tolist()
            for j, i in enumerate(inputs.sample_index):
                rid = inputs.request_ids[i]
                self.rows.setdefault(rid, []).append((idx[j], vals[j][0], vals[j][1]))
            return logits

        eng.runner.execute = execute


def check_tokens(p: Proc, model) -> dict:
    """Greedy tokens of the check prompts and their top-2 logits."""
    g = torch.Generator().manual_seed(SEED + 17)
    lens = torch.randint(8, 301, (CHECK_PROMPTS,), generator=g).tolist()
    V = model.config.vocab_size
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
    if p.dry:
        prompts = [t[:24] for t in prompts[:4]]
    new = 4 if p.dry else CHECK_NEW
    eng = LLMEngine(model, page_size=16, num_pages=len(prompts) * 24 + 8, max_num_seqs=16,
                    max_num_batched_tokens=2048, max_model_len=340,
                    tensor_parallel_size=p.tp, seed=SEED)  # fmt: skip
    tap = LogitTap(eng)
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request({"prompt_token_ids": t}, params) for t in prompts]
    toks: dict[int, list[int]] = {i: [] for i in ids}
    while eng.has_unfinished_requests():
        for o in eng.step():
            toks[o.request_id] = list(o.outputs[0].token_ids)
    graphs = eng.runner.graphs
    out = dict(
        tokens=[toks[i] for i in ids],
        top2=[[list(r) for r in tap.rows.get(i, [])] for i in ids],
        replays=graphs.num_replays if graphs is not None else 0,
        kv_heads_per_rank=eng.kv_params.n_kv_heads,
        pages=sorted((str(r), eng.manager.pages(r)) for r in eng.manager.request_ids),
    )
    del eng
    return out


def speed(p: Proc, model, b: int, graphs: bool, profile: bool) -> dict:
    """`bench_model.serve` of b requests of a 512-token prompt: decode step times, the graph
    replay alone and (profile) the kernel table of a replay."""
    case = bm.Case(f"b{b}", "", b, 512, 0.0, steps=16 if graphs else 6, warmup=3)
    if p.dry:
        case = bm.shrink(case)
    ctx = bm.Ctx([], {}, SEED, p.dry)
    ctx.tp = p.tp
    V = model.config.vocab_size
    toks = bm.prompts(case, V, SEED * 1000 + zlib.crc32(case.name.encode()))
    try:
        res = bm.serve(ctx, case, model, toks, graphs=graphs)
    except Exception as e:  # noqa: BLE001 - a failed capture: record it, time eager steps
        if not graphs:
            raise
        ctx.errors.append(f"graphs failed: {type(e).__name__}: {str(e)[:300]}")
        p.free()
        return speed(p, model, b, graphs=False, profile=False) | {"errors": ctx.errors}
    eng = res.pop("engine")
    b = case.b
    out = dict(res, errors=ctx.errors, batch=b, prompt=case.prompt, graphs=graphs)
    if graphs:
        out["replay_ms"] = bm.replay_ms(ctx, eng, b, 10)
        if profile:
            out["profile"] = bm.profile_step(ctx, eng, case)
            out["profile"]["nccl_us"] = nccl_us(out["profile"])
    out["cost"] = bm.step_cost(model, b, res["ctx_sum"])
    del eng
    return out


def nccl_us(prof: dict) -> float:
    """us a step of the profile's NCCL kernels (among its top kernels)."""
    return round(sum(r["us"] for r in prof["top"] if "nccl" in r["name"].lower()), 2)


def nccl_times(p: Proc) -> dict:
    """All-reduce ms of the decode steps' messages and of 256 MiB (bf16), timed with CUDA
    events over `NCCL_REPS` calls (every rank the same calls); this GPU's copy bandwidth."""
    import torch.distributed as dist  # noqa: PLC0415

    hidden = LLAMA["hidden_size"]
    sizes = {f"b{b} x hidden": b * hidden * 2 for b in SPEED_BATCHES} | {"256 MiB": ALLREDUCE_BIG}
    if p.dry:
        sizes = {k: min(v, 2**16) for k, v in sizes.items()}
    out: dict = {}
    for label, nbytes in sizes.items():
        x = torch.randn(nbytes // 2, device=p.dev, dtype=p.dtype)
        for _ in range(5):
            dist.all_reduce(x)
        p.sync()
        t0 = time.perf_counter()
        if p.dry:
            for _ in range(3):
                dist.all_reduce(x)
            ms = (time.perf_counter() - t0) * 1e3 / 3
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(NCCL_REPS):
                dist.all_reduce(x)
            end.record()
            p.sync()
            ms = start.elapsed_time(end) / NCCL_REPS
        out[label] = dict(bytes=nbytes, ms=round(ms, 5), gb_per_s=round(nbytes / ms / 1e6, 1))
        del x
    if not p.dry:
        out["copy_gb_per_s"] = round(copy_bandwidth(), 1)
    return out


def stream(dry: bool, n: int | None = None, seed: int = SEED + 59) -> list[tuple[list[int], int]]:
    """The request stream: (prompt tokens, output tokens) of `n` (default `STREAM_REQUESTS`)
    requests, prompt lengths lognormal (median 256, clipped to [32, 2048]) and outputs
    lognormal (median 128, clipped to [16, 512]), from a generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    n = n if n is not None else 12 if dry else STREAM_REQUESTS
    pl = torch.empty(n).log_normal_(math.log(256), 1.0, generator=g).clamp(32, 2048).long()
    ol = torch.empty(n).log_normal_(math.log(128), 0.7, generator=g).clamp(16, 512).long()
    if dry:
        pl, ol = pl.clamp(max=24), ol.clamp(max=4)
    V = (DRY if dry else LLAMA)["vocab_size"]
    return [(torch.randint(0, V, (int(a),), generator=g).tolist(), int(o))
            for a, o in zip(pl, ol)]  # fmt: skip


def dispatch(reqs: list[tuple[list[int], int]], replicas: int) -> list[list[int]]:
    """Request indices per replica: each request, in arrival order, to the replica with the
    fewest assigned tokens (prompt + output) so far."""
    load = [0] * replicas
    parts: list[list[int]] = [[] for _ in range(replicas)]
    for i, (prompt, n) in enumerate(reqs):
        r = min(range(replicas), key=lambda k: load[k])
        parts[r].append(i)
        load[r] += len(prompt) + n
    return parts


def serve_requests(eng: LLMEngine, reqs: list[tuple[list[int], int]]) -> list[float]:
    """Add every (prompt, output length) request and step the engine until all finish; each
    step's wall time (ms; a step reads its sampled tokens back, so it includes the GPU's)."""
    for prompt, n in reqs:
        eng.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=n, ignore_eos=True))
    times = []
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def serve_stream(p: Proc, cfg: dict, part: int | None) -> dict:
    """Serve the stream (part None) or this replica's share of it on one engine; wall time
    from a common start (a barrier between the replicas) to the last token.

    Before the start, every engine serves `STREAM_WARMUP` (the batch cap) requests of another
    seed (outputs cut to 8 tokens): the prefill kernels' JIT compiles and autotuning happen
    there, not in the timed stream. Without it the first phase to run paid them and the later
    one loaded Triton's disk cache: DP measured 2.58x one replica (H200 x2, 2026-11-29).
    The slowest steps are recorded to show any stall left, and so are the kernels compiled
    during the timed stream (`ops.launch.jit_compiles`; the engine compiles its eager steps'
    variants at start-up, docs/kernels/jit_specializations.md)."""
    reqs = stream(p.dry)
    idx = list(range(len(reqs))) if part is None else dispatch(reqs, p.world)[part]
    model = random_model(cfg, p.dev, p.dtype, SEED)
    t_start = time.perf_counter()
    with jit_compiles() as at_start:
        eng = LLMEngine(model, page_size=16, num_pages=256 if p.dry else 16384,
                        max_num_seqs=8 if p.dry else 256,
                        max_num_batched_tokens=64 if p.dry else 8192, seed=SEED)  # fmt: skip
    startup_s = time.perf_counter() - t_start
    warm = stream(p.dry, n=4 if p.dry else STREAM_WARMUP, seed=SEED + 60)
    serve_requests(eng, [(prompt, min(n, 8)) for prompt, n in warm])
    eng.reset_stats()
    p.sync()
    p.barrier()
    t0 = time.perf_counter()
    with jit_compiles() as compiled:  # none expected: the engine compiled its variants at start
        times = serve_requests(eng, [reqs[i] for i in idx])
    p.sync()
    wall = time.perf_counter() - t0
    st = eng.stats()
    gen = st.generated_tokens
    slow = sorted(range(len(times)), key=lambda i: -times[i])[:10]
    median = sorted(times)[len(times) // 2]
    out = dict(requests=len(idx), wall_s=round(wall, 3), steps=len(times), generated_tokens=gen,
               prompt_tokens=st.prompt_tokens, preemptions=st.preemptions,
               tokens_per_s=round(gen / wall, 1), step_ms_median=round(median, 2),
               steps_over_100ms_s=round(sum(t for t in times if t > 100) / 1e3, 2),
               slowest_steps=[(i, round(times[i], 1)) for i in slow],
               startup_s=round(startup_s, 1), compiles_at_startup=len(at_start),
               compiles_in_stream=compiled)  # fmt: skip
    del eng, model
    p.free()
    return out


# --- the driver --------------------------------------------------------------------------------


def run_phase(phase: str, world: int, dry: bool, work: str, only: str | None) -> list[dict]:
    import torch.multiprocessing as mp  # noqa: PLC0415

    n = 1 if phase in ("single", "stream") else world
    t0 = time.perf_counter()
    mp.spawn(worker, args=(n, phase, dry, work, only), nprocs=n, join=True)
    print(f"[tp] phase {phase}: {time.perf_counter() - t0:.1f} s", flush=True)
    return [json.load(open(os.path.join(work, f"{phase}-rank{r}.json"))) for r in range(n)]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def compare_tokens(single: dict, tp: dict) -> dict:
    """TP tokens against one GPU's, equal up to the first near-tie (module docstring)."""
    noise = 0.0
    for s_rows, t_rows in zip(single["top2"], tp["top2"]):
        for s, t in zip(s_rows, t_rows):
            if s[0] != t[0]:
                break
            noise = max(noise, abs(s[1] - t[1]))
    tol = TIE_FACTOR * noise
    reqs = []
    ok = True
    for k, (a, b) in enumerate(zip(single["tokens"], tp["tokens"])):
        i = first_divergence(a, b)
        if i is None:
            reqs.append(dict(request=k, equal=True, tokens=len(a)))
            continue
        top1, top2 = single["top2"][k][i][1:]
        tie = top1 - top2 <= tol
        ok &= tie
        reqs.append(dict(request=k, equal=False, first_diff=i, gap=round(top1 - top2, 5),
                         near_tie=tie))  # fmt: skip
    return dict(
        ok=bool(ok),
        requests=len(reqs),
        equal=sum(r["equal"] for r in reqs),
        tokens_compared=sum(len(a) for a in single["tokens"]),
        tokens_before_divergence=sum(r.get("first_diff", r.get("tokens", 0)) for r in reqs),
        logit_noise=round(noise, 5),
        tie_tolerance=round(tol, 5),
        diverged=[r for r in reqs if not r["equal"]],
    )


def merge(results: dict[str, list[dict]], world: int, dry: bool) -> tuple[list[Record], dict]:
    """Records (one per model x batch x setup) and the summary of the phases' outputs."""
    single, tp = results.get("single", [None])[0], results.get("tp", [None])[0]
    summary: dict = {"world": world, "errors": []}
    records: list[Record] = []
    if tp is not None:
        summary["nccl"] = tp["nccl"]
        ranks = results["tp"]
        summary["tp_ranks_same_tokens"] = all(
            r["models"][m]["check"]["tokens"] == tp["models"][m]["check"]["tokens"]
            and r["models"][m]["check"]["pages"] == tp["models"][m]["check"]["pages"]
            for r in ranks
            for m in tp["models"]
        )
    for m in (single or tp or {"models": {}})["models"]:
        s = single["models"].get(m) if single else None
        t = tp["models"].get(m) if tp else None
        for key, label in (("check", m), ("check_float32", f"{m} float32")):
            if not (s and t and key in s and key in t):
                continue
            cmp = compare_tokens(s[key], t[key])
            cmp["kv_heads_per_rank"] = t[key]["kv_heads_per_rank"]
            summary.setdefault("check", {})[label] = cmp
            if not cmp["ok"]:
                summary["errors"].append(
                    f"{label}: TP tokens differ from one GPU's beyond a near-tie"
                )
        for setup, res in (("1 GPU", s), (f"TP {world}", t)):
            if res is None:
                continue
            for b, sp in res["speed"].items():
                records.append(speed_record(m, int(b), setup, sp, s, tp, world, dry))
                summary["errors"] += [f"{m} {setup} b{b}: {e}" for e in sp["errors"]]
    dp = results.get("dp")
    stream1 = results.get("stream", [None])[0]
    if stream1 and dp:
        one = stream1["stream"]
        wall = max(r["stream"]["wall_s"] for r in dp)
        gen = sum(r["stream"]["generated_tokens"] for r in dp)
        summary["dp"] = dict(
            replicas=len(dp), one_replica=one, per_replica=[r["stream"] for r in dp],
            wall_s=wall, generated_tokens=gen, tokens_per_s=round(gen / wall, 1),
            x_one_replica=round(gen / wall / one["tokens_per_s"], 3),
        )  # fmt: skip
    return records, summary


def speed_record(m, b, setup, sp, single, tp, world, dry) -> Record:
    """One decode-speed record; with the TP ranks' two-GPU roofline (module docstring)."""
    ms = sum(sp["ms"]) / len(sp["ms"])
    cost = sp["cost"]
    e = dict(batch=b, setup=setup, tokens_per_s=round(b / ms * 1e3, 1),
             ms_median=sorted(sp["ms"])[len(sp["ms"]) // 2], graphs=sp["graphs"],
             replay_ms=sp.get("replay_ms"), dry_run=dry)  # fmt: skip
    if single is not None and str(b) in single["speed"] and setup != "1 GPU":
        one = single["speed"][str(b)]
        one_ms = sum(one["ms"]) / len(one["ms"])
        e["x_one_gpu"] = round(one_ms / ms, 3)
        if tp is not None and not dry and tp["nccl"]:
            nccl = tp["nccl"]
            copy = nccl["copy_gb_per_s"] * 1e9
            big = nccl["256 MiB"]["gb_per_s"] * 1e9
            c1 = one["cost"]
            cfg = MODELS[m]
            ar_bytes = 2 * cfg["num_hidden_layers"] * b * cfg["hidden_size"] * 2
            roof = ((c1["weight_bytes"] + c1["kv_bytes"]) / world / copy + ar_bytes / big) * 1e3
            e.update(roofline_2gpu_ms=round(roof, 5), frac_roofline=round(roof / ms, 4),
                     allreduce_bytes=ar_bytes)  # fmt: skip
            if sp.get("replay_ms"):
                e["replay_frac_roofline"] = round(roof / sp["replay_ms"], 4)
    if sp.get("profile"):
        prof = sp["profile"]
        e["profile"] = prof
        if prof["kernel_us"]:
            e["allreduce_share"] = round(prof["nccl_us"] / prof["kernel_us"], 4)
    return Record(SUITE, f"{m} b{b}", setup, ms, cost["bytes"], cost["flops"], e)


def table(records: list[Record], summary: dict) -> str:
    lines = [f"{'case':24} {'setup':8} {'ms/step':>9} {'tok/s':>9} {'x 1 GPU':>8} "
             f"{'of 2-GPU roof':>13} {'allreduce':>9}"]  # fmt: skip
    for r in records:
        e = r.extra
        lines.append(
            f"{r.config:24} {r.impl:8} {r.ms:9.3f} {e['tokens_per_s']:9.1f} "
            f"{e.get('x_one_gpu', float('nan')):8.3f} {e.get('frac_roofline', float('nan')):13.3f} "
            f"{e.get('allreduce_share', float('nan')):9.3f}"
        )
    for m, c in summary.get("check", {}).items():
        lines.append(f"check {m}: {c['equal']}/{c['requests']} equal, "
                     f"{c['tokens_before_divergence']}/{c['tokens_compared']} tokens before a "
                     f"divergence, ok={c['ok']}, noise {c['logit_noise']}")  # fmt: skip
    if "dp" in summary:
        d = summary["dp"]
        one = d["one_replica"]["tokens_per_s"]
        lines.append(f"dp: {d['replicas']} replicas {d['tokens_per_s']} tok/s, "
                     f"one replica {one}, x{d['x_one_replica']}")  # fmt: skip
    if "nccl" in summary:
        ar = summary["nccl"]
        lines.append("nccl: " + ", ".join(
            f"{k} {v['ms']:.4f} ms" for k, v in ar.items() if isinstance(v, dict)))  # fmt: skip
    return "\n".join(lines)


def plot(path: str, records: list[Record], summary: dict, env: dict) -> str:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = sorted({r.config for r in records})
    setups = sorted({r.impl for r in records})
    w = 0.8 / max(1, len(setups))
    for k, s in enumerate(setups):
        ys = [next((r.extra["tokens_per_s"] for r in records if r.config == c and r.impl == s), 0)
              for c in labels]  # fmt: skip
        ax.bar([i + k * w for i in range(len(labels))], ys, w, label=s)
    if "dp" in summary:
        d = summary["dp"]
        labels.append("stream (DP)")
        ax.bar(len(labels) - 1, d["one_replica"]["tokens_per_s"], w, color="C0")
        ax.bar(len(labels) - 1 + w, d["tokens_per_s"], w, color="C2", label="DP 2 replicas")
    ax.set_xticks([i + w / 2 for i in range(len(labels))], labels, rotation=20, fontsize=8)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"pagedattn TP/DP, {env.get('device', '?')}, {env.get('date', '')}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.splitext(path)[0] + ".png"
    fig.savefig(png, dpi=120)
    return png


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--only", default=None, help="models whose name contains this")
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="folder of the phases' JSON (kept)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--share-gpu", action="store_true", help="more ranks than GPUs (gloo)")
    a = ap.parse_args(argv)
    if not a.dry_run and a.phases:
        n = torch.cuda.device_count()
        if n < a.world and not a.share_gpu:
            raise SystemExit(f"--world {a.world}: only {n} GPU(s) (--share-gpu: gloo, eager)")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (device rules)
    work = a.work or tempfile.mkdtemp(prefix="bench_tp_")
    os.makedirs(work, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for phase in filter(None, a.phases.split(",")):
        existing = os.path.join(work, f"{phase}-rank0.json")
        if os.path.exists(existing) and a.work:  # a phase of an earlier call
            n = 1 if phase in ("single", "stream") else a.world
            results[phase] = [json.load(open(os.path.join(work, f"{phase}-rank{r}.json")))
                              for r in range(n)]  # fmt: skip
            continue
        results[phase] = run_phase(phase, a.world, a.dry_run, work, a.only)
    for phase in PHASES:  # earlier calls' phases in the same work folder
        f = os.path.join(work, f"{phase}-rank0.json")
        if phase not in results and os.path.exists(f):
            n = 1 if phase in ("single", "stream") else a.world
            results[phase] = [json.load(open(os.path.join(work, f"{phase}-rank{r}.json")))
                              for r in range(n)]  # fmt: skip
    records, summary = merge(results, a.world, a.dry_run)
    # The machine the phases ran on (a merge-only call may run elsewhere).
    env = next(iter(results.values()))[0]["env"] if results else environment(False)
    out = a.out or os.path.join(work, "tp.json")
    meta = dict(suite=SUITE, seed=SEED, dry_run=a.dry_run, summary=summary,
                phases={k: v for k, v in results.items()})  # fmt: skip
    save(out, env, {}, records, meta)
    png = plot(out, records, summary, env)
    print(table(records, summary))
    print(f"[tp] wrote {out} and {png}")
    if summary["errors"]:
        print("[tp] ERRORS:\n  " + "\n  ".join(summary["errors"]))


if __name__ == "__main__":
    main()
