"""CUDA graphs for decode steps (engine/cuda_graphs.py), on a tiny random Llama, gpt-oss and
DeepSeek-V3 (the MoE models' experts as grouped matmuls on the CPU, `layers.grouped_experts_ok`,
and through `ops.moe` on CUDA, FP8 DeepSeek included; DeepSeek's step plan from `num_decodes`).

CPU: the graph path emulated (`GraphRunner(emulate=True)`: the static buffers, the padding to a
bucket and the fixed-width lookup table of a replay, with the captured function run eagerly)
gives exactly the eager engine's greedy tokens and logits, over steps whose batch size shrinks
and grows across buckets, with chunked prefill, shared prefixes and a request arriving late;
after every replay the rows past the batch are pad rows and the pad page is nobody else's; the
engine hides the pad page from its stats; a replay after the lengths changed equals a fresh
eager call of the same step; buckets; which models and settings get graphs.

GPU (`-m gpu`): the engine with captured graphs against `enforce_eager=True` on a tiny random
bfloat16 Llama (tokens equal, the first replayed step's logits close), and every replay, made
under `torch.cuda.set_sync_debug_mode("error")` (no host sync), against a fresh eager call.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from tiny_llama import save_tiny_deepseek, save_tiny_gpt_oss, save_tiny_llama, save_tiny_qwen2_moe

from pagedattn.engine import LLM, SamplingParams
from pagedattn.engine.cuda_graphs import (
    PAD_REQUEST,
    aligned_row_steps,
    decode_buckets,
    graph_mode,
    warm_up_steps,
)
from pagedattn.errors import InvalidArgumentError
from pagedattn.models.layers import fused_experts_ok, grouped_experts_ok
from pagedattn.models.llama import LlamaForCausalLM

pytest.importorskip("transformers")

VOCAB = 256


class EmulatedLLM(LLM):
    """An engine whose decode graphs are emulated (any device)."""

    _emulate_cuda_graphs = True


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


SAVERS = {
    "llama": save_tiny_llama,
    "gpt_oss": save_tiny_gpt_oss,
    "deepseek": save_tiny_deepseek,
    "qwen2_moe": save_tiny_qwen2_moe,
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_graphs")
    save_tiny_llama(path, 2468, VOCAB)
    return str(path)


@pytest.fixture(scope="module", params=sorted(SAVERS))
def any_ckpt(request, tmp_path_factory):
    """A tiny checkpoint of each capturable family."""
    path = tmp_path_factory.mktemp(f"{request.param}_graphs")
    SAVERS[request.param](path, 2468, VOCAB)
    return str(path)


class Recorder:
    """Wraps an engine's runner: records each step's sampling request ids (one a logits row),
    whether a graph served it, and a copy of its logits; after a replay checks the pad rows
    and the pad page."""

    def __init__(self, llm) -> None:
        self.llm, self.runner = llm, llm.runner
        self.graphs = llm.runner.graphs  # (the engine stages decode steps into them)
        self.greedy_tokens = llm.runner.greedy_tokens  # (and takes their replays' argmax)
        self.steps: list[tuple[list, bool, torch.Tensor]] = []
        self.num_staged = 0
        self.num_gathered = 0  # staged steps whose deferred tokens the unpack took

    def execute(self, inputs):
        g = self.runner.graphs
        served = g is not None and g.serves(inputs)
        staged = g is not None and inputs.staged is g.staging
        assert not staged or served
        self.num_staged += staged
        deferred = bool((inputs.host.input_ids < 0).any())
        self.num_gathered += staged and deferred and inputs.deferred is None
        out = self.runner.execute(inputs)
        ids = [inputs.request_ids[i] for i in inputs.sample_index]
        self.steps.append((ids, served, out.detach().cpu().clone()))
        if served:
            check_pad_rows(g, self.llm.manager, inputs.batch_size, staged)
        return out


def check_pad_rows(g, mgr, n: int, staged: bool = False) -> None:
    """Rows [n, upto) of the static buffers are pad rows after a replay of n requests: up to
    the bucket's end where the step was staged (its graph's unpack writes rows [0, bucket);
    the rows past it, which that graph does not read, keep older steps' values), else to the
    end (`DecodeBuffers.load` resets every row an earlier step used)."""
    s = g.buffers
    upto = g.bucket(n) if staged else s.max_batch
    assert s._dirty >= upto if staged else s._dirty == n
    pad_row = torch.full_like(s.kv.lookup_table[0], mgr.total_num_pages)
    pad_row[0] = g.pad_page
    lut = s.kv.lookup_table[n:upto].cpu()
    assert torch.equal(lut, pad_row.cpu().expand_as(lut))
    assert not s.kv.cache_lengths[n:upto].any()
    assert not s.input_ids[n:upto].any() and not s.positions[n:upto].any()
    assert torch.equal(s.q_row_offsets.cpu(), torch.arange(s.max_batch + 1, dtype=torch.int32))
    for rid in mgr.request_ids:  # the pad page is the pad request's alone
        assert (rid is PAD_REQUEST) == (g.pad_page in mgr.pages(rid))


def run_workload(llm, prompts, max_tokens, late_prompt, late_step):
    """Every prompt with its max_tokens (greedy), one more request added before step
    `late_step`; returns each request's tokens (in the order of their ids 0, 1, ...) and the
    `Recorder`."""
    rec = Recorder(llm)
    llm.runner = rec
    ids = [
        llm.add_request(
            {"prompt_token_ids": p}, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
        )
        for p, m in zip(prompts, max_tokens)
    ]
    out: dict[int, list[int]] = {}
    step = 0
    try:
        while llm.has_unfinished_requests() or step <= late_step:
            if step == late_step:
                params = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
                ids.append(llm.add_request({"prompt_token_ids": late_prompt}, params))
            for o in llm.step():
                out.setdefault(o.request_id, []).extend(o.outputs[0].new_token_ids)
            step += 1
    finally:
        llm.runner = rec.runner
    assert ids == list(range(len(ids)))  # a fresh engine
    return [out[i] for i in ids], rec


def workload():
    g = torch.Generator().manual_seed(5)
    base = torch.randint(0, VOCAB, (11,), generator=g).tolist()
    prompts = [
        base,
        base[:8] + [3, 4],  # shares 2 pages of 4 with base
        torch.randint(0, VOCAB, (5,), generator=g).tolist(),
        [7],
        torch.randint(0, VOCAB, (9,), generator=g).tolist(),
        base + [9],
    ]
    max_tokens = [20, 3, 9, 6, 1, 12]  # the decode batch shrinks 6 -> 1 across buckets
    late = torch.randint(0, VOCAB, (6,), generator=g).tolist()
    return prompts, max_tokens, late, 12  # the late request makes the batch grow again


KW = dict(page_size=4, num_pages=40, max_num_batched_tokens=16, max_num_seqs=8)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_emulated_graphs_give_the_eager_tokens_and_logits(any_ckpt, async_scheduling):
    """Also overlapped (`async_scheduling`): the replays then take their deferred input tokens
    from the previous step's samples on the device."""
    eager = LLM(any_ckpt, device="cpu", dtype=torch.float32, **KW)
    assert eager.runner.graphs is None  # the CPU runs eagerly
    emu = EmulatedLLM(any_ckpt, device="cpu", dtype=torch.float32,
                      async_scheduling=async_scheduling, **KW)  # fmt: skip
    g = emu.runner.graphs
    assert g is not None and g.buckets == (1, 2, 4, 8) and sorted(g.graphs) == [1, 2, 4, 8]
    assert emu.manager.total_num_pages == 41 and emu.stats().total_pages == 40
    assert emu.manager.request_ids == [PAD_REQUEST] and emu.stats().used_pages == 0

    args = workload()
    want, rec_e = run_workload(eager, *args)
    got, rec_g = run_workload(emu, *args)
    assert got == want
    assert [len(t) for t in got] == [*args[1], 7]
    # Step by step: the same batches and bit-identical logits (gpt-oss: within float32
    # roundings, as the pad rows change its experts' group sizes, hence the matmuls' blocking).
    assert len(rec_g.steps) == len(rec_e.steps)
    for (ids_g, served, lg), (ids_e, _, le) in zip(rec_g.steps, rec_e.steps):
        assert ids_g == ids_e
        same(lg, le, exact=exact_family(any_ckpt), what=f"step of {ids_g} (graph: {served})")
    served = [(len(ids), s) for ids, s, _ in rec_g.steps]
    sizes = [n for n, s in served if s]
    print("steps (batch, replayed):", served)
    assert g.num_replays == len(sizes) >= 10
    assert rec_g.num_staged == len(sizes)  # every replayed step staged into the buffers
    # overlapped: a replay after a replay takes its inputs from the one before's argmax
    assert (rec_g.num_gathered > 0) == async_scheduling
    assert {g.bucket(n) for n in sizes} == {1, 2, 4, 8}  # every bucket replayed
    assert any(b > a for a, b in zip(sizes, sizes[1:]))  # grew again after shrinking
    first = next(i for i, (_, s) in enumerate(served) if s)
    assert not all(s for _, s in served[first:])  # the late request's prefill ran eagerly
    st = emu.stats()
    assert st.used_pages == 0 and st.total_pages == 40 and st.peak_used_pages <= 40
    assert emu.manager.request_ids == [PAD_REQUEST]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_emulated_graphs_sampled_and_greedy_requests_give_the_eager_tokens(ckpt, async_scheduling):
    """Requests drawn with temperature (seeded; two with top-k / top-p) beside greedy ones:
    replayed steps with a drawn row sample outside the graph and feed the next step's inputs,
    all-greedy ones take the graph's argmax (once the drawn requests finished, the next
    replays take their inputs from it); the tokens equal the eager engine's, request by
    request."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (7, 3, 9, 5, 6)]
    params = [
        SamplingParams(max_tokens=18, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.8, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=1.2, seed=2, top_k=20, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=4, temperature=0.7, seed=3, top_p=0.8, ignore_eos=True),
    ]
    outs = []
    for cls in (LLM, EmulatedLLM):
        llm = cls(ckpt, device="cpu", dtype=torch.float32, async_scheduling=async_scheduling, **KW)
        rec = Recorder(llm)
        llm.runner = rec
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        outs.append([r.outputs[0].token_ids for r in res])
        if cls is EmulatedLLM:
            assert rec.num_staged >= 10 and (rec.num_gathered > 0) == async_scheduling
    assert outs[0] == outs[1]
    assert [len(t) for t in outs[1]] == [p.max_tokens for p in params]


def replays_vs_eager(llm, prompts, max_tokens, replayer, compare, *, no_sync: bool = False):
    """Runs the prompts greedily; each step `replayer` (a runner's `GraphRunner` or
    `MixedGraphRunner`) serves, and the engine's other graphs do not, is replayed, then run
    eagerly (it rewrites the same K/V), `compare(inputs, replayed, eager)`; no_sync: replays
    under `torch.cuda.set_sync_debug_mode("error")`. Returns the inputs of the replayed steps."""
    runner = llm.runner
    seen = []

    class Checker:
        # the engine stages its decode steps into the decode graphs' buffers (their replay
        # unpacks them; the eager call after it reads the same buffers)
        graphs = runner.graphs if replayer is runner.graphs else None

        def execute(self, inputs):
            if not replayer.serves(inputs) or (
                replayer is not runner.graphs and runner.graphs.serves(inputs)
            ):
                return runner.execute(inputs)
            if no_sync:
                torch.cuda.set_sync_debug_mode("error")
            try:
                got = replayer.run(inputs).clone()
            finally:
                if no_sync:
                    torch.cuda.set_sync_debug_mode("default")
            want = runner.eager(inputs)
            compare(inputs, got, want)
            seen.append(inputs)
            return want

    llm.runner = Checker()
    try:
        params = [
            SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens
        ]
        llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    finally:
        llm.runner = runner
    return seen


def replay_vs_eager(llm, prompts, max_tokens, *, exact: bool, no_sync: bool = False):
    """`replays_vs_eager` of the decode graphs: logits equal (exact), within float32
    roundings (CPU) or close (bf16); returns the replayed batch sizes."""

    def compare(inputs, got, want):
        if exact:
            assert torch.equal(got, want)
        elif got.dtype == torch.float32 and not got.is_cuda:
            same(got, want, exact=False, what=f"replay of {inputs.batch_size}")
        else:
            close(got, want)

    seen = replays_vs_eager(llm, prompts, max_tokens, llm.runner.graphs, compare, no_sync=no_sync)
    return [inputs.batch_size for inputs in seen]


TIE_GAP = 0.05  # bf16 logits of the same step at two batch sizes may differ by a few roundings


def graph_vs_eager(graph, eager, run, args, what: str):
    """The workload `args` through `run(llm, *args) -> (tokens, Recorder)` on the eager engine,
    then on the one with graphs; the tokens compared (`compare_tokens`). Returns the graph
    engine's `Recorder`, the eager one's, and the indices of the steps a graph served (printed
    with the ties under `what`)."""
    want, rec_e = run(eager, *args)
    got, rec_g = run(graph, *args)
    ties = compare_tokens(got, want, rec_e)
    served = [i for i, (_, s, _) in enumerate(rec_g.steps) if s]
    print(f"{what} {len(served)} of {len(rec_g.steps)} steps, bf16 ties {ties}")
    return rec_g, rec_e, served


def compare_tokens(got, want, rec_want) -> int:
    """Greedy tokens equal, except that a request may diverge where `want`'s top-2 logits sit
    within TIE_GAP (a bf16 tie, reported as a warning; compared up to there). Returns the
    number of ties."""
    ties = 0
    for r, (a, b) in enumerate(zip(got, want)):
        if a == b:
            continue
        j = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
        rows = [lg[ids.index(r)] for ids, _, lg in rec_want.steps if r in ids]
        top2 = rows[j].topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap < TIE_GAP, f"request {r} token {j}: {a[j]} != eager {b[j]} (gap {gap:.3g})"
        warnings.warn(f"request {r} token {j}: eager top-2 tie (gap {gap:.1e})", stacklevel=2)
        ties += 1
    return ties


def exact_family(path: str) -> bool:
    """Whether a family's float32 CPU logits are independent of the batch's padding (the
    Llama family; not the MoE models, whose expert group sizes change with the pad rows), on
    a CPU whose float32 matmul is (`_matmul_batch_invariant`)."""
    moe = ("gpt_oss", "deepseek", "qwen2_moe")
    return not any(f in path for f in moe) and _matmul_batch_invariant()


@functools.cache
def _matmul_batch_invariant() -> bool:
    """Whether this CPU's float32 linear gives a row the same bits whatever rows stand beside
    it (a replay pads the batch to its bucket): true of some CPUs' BLAS, not all (on others the
    blocking follows the row count, and the logits differ by float32 roundings)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=g), torch.randn(8, 64, generator=g)
    want = torch.nn.functional.linear(x[:3], w)
    rows = {m: torch.nn.functional.linear(x[:m], w)[:3] for m in (1, 4, 8)}
    return all(torch.equal(y, want[: y.shape[0]]) for y in rows.values())


def same(a: torch.Tensor, b: torch.Tensor, *, exact: bool, what: str) -> None:
    """float32 logits: equal bit for bit, or (exact=False) within a few float32 roundings."""
    if exact:
        assert torch.equal(a, b), what
        return
    err, scale = float((a - b).abs().max()), float(b.abs().max())
    assert err <= 1e-5 * scale, (what, err, scale)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """bfloat16 logits of the same step at two batch sizes: within a few bf16 roundings."""
    scale = float(b.abs().max())
    err = float((a - b).abs().max())
    cos = float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))
    assert err <= 0.03 * scale and cos > 0.9999, (err, scale, cos)


def test_emulated_replay_after_lengths_changed_equals_a_fresh_eager_call(any_ckpt):
    emu = EmulatedLLM(any_ckpt, device="cpu", dtype=torch.float32, **KW)
    prompts, max_tokens, _, _ = workload()
    seen = replay_vs_eager(emu, prompts, max_tokens, exact=exact_family(any_ckpt))
    assert len(seen) >= 10 and len(set(seen)) >= 4


def test_prefill_warm_up_touches_the_pad_page_only(any_ckpt):
    """`GraphRunner.warm_up_eager` (run at start-up on CUDA) runs prefill and mixed steps at
    every class of request count and table width over the pad page: every other page's bytes
    and the manager's entries stay as they were, and the engine then gives the same tokens."""
    args = workload()
    want, _ = run_workload(EmulatedLLM(any_ckpt, device="cpu", dtype=torch.float32, **KW), *args)
    emu = EmulatedLLM(any_ckpt, device="cpu", dtype=torch.float32, **KW)
    g, mgr = emu.runner.graphs, emu.manager
    blocks = mgr.runtime_inputs([PAD_REQUEST])[0].kv_blocks
    blocks.normal_(generator=torch.Generator().manual_seed(3))
    before = blocks.clone()
    state = {rid: mgr.pages(rid) for rid in mgr.request_ids}
    cols = g.buffers.kv.lookup_table.shape[1]
    ran = g.warm_up_eager(KW["max_num_batched_tokens"])
    lengths = emu.model.warm_up_chunk_lengths  # (DeepSeek's: (2, 9))
    assert lengths[0] == 2 and ran == sum(
        (warm_up_steps(8, KW["max_num_batched_tokens"], cols, KW["page_size"], c)
         for c in lengths), ()
    )  # fmt: skip
    assert len(ran) >= 21 and (7, 1, 3) in ran and (0, 8, cols) in ran
    others = [p for p in range(blocks.shape[0]) if p != g.pad_page]
    assert torch.equal(blocks[others], before[others])
    assert not torch.equal(blocks[g.pad_page], before[g.pad_page])  # it did run
    assert {rid: mgr.pages(rid) for rid in mgr.request_ids} == state
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        g.warm_up_eager(1)
    got, _ = run_workload(emu, *args)
    assert got == want


def test_warm_up_steps():
    # counts 1, 3, 7, 8 (int_class_counts(8)); widths 3, 1 and the graphs' 40
    steps = warm_up_steps(8, 16, 40, 4)
    assert steps[:3] == ((0, 1, 1), (0, 1, 3), (0, 1, 40)) and len(steps) == 12 + 9
    assert {(d, n) for d, n, _ in steps} == {(0, 1), (0, 3), (0, 7), (0, 8), (1, 1), (3, 1),
                                             (7, 1)}  # fmt: skip
    # pages of 1 row: widths of 2 tokens' pages at least; 8 tokens a step: 4 chunks, 6 decodes
    steps = warm_up_steps(8, 8, 40, 1)
    assert {w for _, _, w in steps} == {3, 40}
    assert {(d, n) for d, n, _ in steps} == {(0, 1), (0, 3), (0, 4), (1, 1), (3, 1), (6, 1)}
    assert warm_up_steps(1, 2, 1, 16) == ((0, 1, 1),)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        warm_up_steps(8, 1, 40, 4)
    # chunks of 9 tokens (DeepSeek's expanded chunk) on pages of 4: widths of 3 pages at least,
    # 16 tokens a step: 1 chunk, 7 decodes beside one
    steps = warm_up_steps(8, 16, 40, 4, 9)
    assert {w for _, _, w in steps} == {3, 40}
    assert {(d, n) for d, n, _ in steps} == {(0, 1), (1, 1), (3, 1), (7, 1)}
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        warm_up_steps(8, 8, 40, 4, 9)
    with pytest.raises(InvalidArgumentError, match="chunk"):
        warm_up_steps(8, 16, 40, 4, 1)


def test_aligned_row_steps():
    # request counts 3, 7, 8 (int_class_counts(8), 1 has no 16 rows): 16 rows each, decodes
    # first, chunks of at most 8 last
    assert aligned_row_steps(8, 64, 8) == ((1, 7, 8), (1, 1, 1, 1, 1, 3, 8),
                                           (1, 1, 1, 1, 1, 1, 2, 8))  # fmt: skip
    steps = aligned_row_steps(64, 4096, 8)
    assert [len(q) for q in steps] == [3, 7, 15, 16, 31, 32, 63, 64]
    for q in steps:
        assert sum(q) % 16 == 0 and sum(q) > len(q) and max(q) <= 8
        assert list(q) == sorted(q)  # (the engine's order: decodes first)
    assert [sum(q) for q in steps] == [16, 16, 16, 32, 32, 48, 64, 80]
    assert aligned_row_steps(64, 40, 8)[-1] == (1,) * 30 + (2,)  # 48 rows and more: too many
    # 2 queries a request at most: 16 rows need 8 requests (3 and 7 have no such step)
    assert [len(q) for q in aligned_row_steps(64, 4096, 2)] == [15, 16, 31, 32, 63, 64]
    with pytest.raises(InvalidArgumentError, match="max_q"):
        aligned_row_steps(8, 64, 1)


def test_buckets():
    assert decode_buckets(1) == (1,)
    assert decode_buckets(5) == (1, 2, 4, 5)
    assert decode_buckets(8) == (1, 2, 4, 8)
    assert decode_buckets(16) == (1, 2, 4, 8, 16)
    assert decode_buckets(40) == (1, 2, 4, 8, 16, 32, 40)
    b = decode_buckets(256)
    assert b[:5] == (1, 2, 4, 8, 16) and b[-1] == 256 and len(b) == 20
    assert all(x < y for x, y in zip(b, b[1:]))
    with pytest.raises(InvalidArgumentError, match="max_batch"):
        decode_buckets(0)


def test_which_models_and_settings_get_graphs(ckpt):
    assert LlamaForCausalLM.supports_cuda_graphs is True
    # gpt-oss: where its experts are grouped matmuls without a host sync
    assert grouped_experts_ok(torch.device("cuda"), torch.bfloat16)
    assert not grouped_experts_ok(torch.device("cuda"), torch.float32)  # a host-synced loop
    assert grouped_experts_ok(torch.device("cpu"), torch.float32)
    # on CUDA in bf16 / fp16 the MoE models' experts run through ops.moe (plain or FP8 weights)
    assert fused_experts_ok(torch.device("cuda"), torch.bfloat16)
    assert fused_experts_ok(torch.device("cuda"), torch.float16)
    assert not fused_experts_ok(torch.device("cuda"), torch.float32)
    assert not fused_experts_ok(torch.device("cpu"), torch.bfloat16)
    llm = LLM(ckpt, device="cpu", dtype=torch.float32, **KW)
    model, cuda = llm.model, torch.device("cuda")
    assert graph_mode(model, cuda, enforce_eager=False, tp_size=1) == "cuda"
    assert graph_mode(model, torch.device("cpu"), enforce_eager=False, tp_size=1) is None
    assert graph_mode(model, cuda, enforce_eager=True, tp_size=1) is None
    # TP: NCCL's all-reduces are captured; without an NCCL group (here none) steps stay eager
    assert graph_mode(model, cuda, enforce_eager=False, tp_size=2) is None
    assert graph_mode(model, cuda, enforce_eager=False, tp_size=1, emulate=True) == "emulated"
    assert graph_mode(torch.nn.Linear(2, 2), cuda, enforce_eager=False, tp_size=1) is None
    eager = EmulatedLLM(ckpt, device="cpu", dtype=torch.float32, enforce_eager=True, **KW)
    assert eager.runner.graphs is None and eager.manager.total_num_pages == 40
    with pytest.raises(InvalidArgumentError, match="enforce_eager"):
        LLM(ckpt, device="cpu", dtype=torch.float32, enforce_eager="no", **KW)


@pytest.mark.gpu
@pytest.mark.parametrize("family", [*sorted(SAVERS), "deepseek_fp8"])
def test_cuda_graphs_match_eager_on_cuda(family, tmp_path):
    """deepseek_fp8: DeepSeek's FP8 block weights (experts through `ops.moe`, attention
    through the fused FP8 MLA branch), captured like the others."""
    if family == "deepseek_fp8":
        from test_models_deepseek import _fp8_checkpoints

        path = _fp8_checkpoints(tmp_path)[0]
    else:
        path = tmp_path
        SAVERS[family](tmp_path, 1357, VOCAB)
    kw = dict(device="cuda", dtype=torch.bfloat16, **KW)
    graph = LLM(str(path), **kw)
    g = graph.runner.graphs
    assert g is not None and not g.emulate and sorted(g.graphs) == [1, 2, 4, 8]
    assert all(isinstance(x, torch.cuda.CUDAGraph) for x in g.graphs.values())
    eager = LLM(str(path), enforce_eager=True, **kw)
    assert eager.runner.graphs is None

    rec_g, rec_e, replayed = graph_vs_eager(graph, eager, run_workload, workload(), "replayed")
    assert g.num_replays == len(replayed) >= 10
    first = replayed[0]
    for i in range(first + 1):  # the eager steps before the first replay, and that replay
        assert rec_g.steps[i][0] == rec_e.steps[i][0]
        close(rec_g.steps[i][2], rec_e.steps[i][2])

    # Every replay (lengths and batch sizes changed since capture) against a fresh eager call.
    prompts, max_tokens, _, _ = workload()
    seen = replay_vs_eager(graph, prompts, max_tokens, exact=False, no_sync=True)
    assert len(seen) >= 10 and len(set(seen)) >= 4
    del graph, eager
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_pdl_chain_changes_no_bit(tmp_path, monkeypatch):
    """The decode step's layer kernels launched as a PDL chain (`ops.pdl.pdl_chain_kwargs`,
    the default on sm_90) give the serial launches' logits bit for bit, replays and eager
    steps alike (head dim 128, pages of 16: the sm_90 kernels an 8B Llama takes)."""
    save_tiny_llama(tmp_path, 531, VOCAB, hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=128)  # fmt: skip
    runs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("PAGEDATTN_PDL", mode)
        llm = LLM(str(tmp_path), device="cuda", dtype=torch.bfloat16, **{**KW, "page_size": 16})
        runs[mode] = run_workload(llm, *workload())
        assert llm.runner.graphs.num_replays >= 10
    (tok0, rec0), (tok1, rec1) = runs["0"], runs["1"]
    assert tok0 == tok1
    assert len(rec0.steps) == len(rec1.steps)
    for a, b in zip(rec0.steps, rec1.steps, strict=True):
        assert a[0] == b[0] and a[1] == b[1]
        assert torch.equal(a[2], b[2])


def _serve_waves_compiles(llm, seed: int) -> tuple[int, list]:
    """Serve requests in waves (chunk counts and decode counts that vary from step to step,
    prompts of 1-700 tokens); the Triton/Gluon kernels compiled meanwhile, and the steps."""
    from pagedattn.ops.launch import jit_compiles

    g = torch.Generator().manual_seed(seed)
    steps = 0
    with jit_compiles() as compiled:
        for _wave in range(4):
            for _ in range(int(torch.randint(5, 30, (1,), generator=g))):
                n = int(torch.randint(1, 700, (1,), generator=g))
                m = int(torch.randint(1, 40, (1,), generator=g))
                params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
                llm.add_request({"prompt_token_ids": torch.randint(0, VOCAB, (n,),
                                generator=g).tolist()}, params)  # fmt: skip
            for _ in range(int(torch.randint(3, 40, (1,), generator=g))):
                llm.step()
                steps += 1
        while llm.has_unfinished_requests():
            llm.step()
            steps += 1
    print(f"{steps} steps, {llm.runner.graphs.num_replays} replays")
    return steps, list(compiled)


@pytest.mark.gpu
def test_serving_compiles_no_kernel_after_start_up(tmp_path):
    """After start-up (decode graphs captured, `warm_up_eager` run), a stream of mixed steps
    (decodes with prefill chunks, at batch sizes, chunk counts and lookup-table widths that
    change from step to step, views at any element offset) compiles no Triton/Gluon kernel: a
    compile in the middle of serving stalled a step for ~5 s (docs/kernels/
    jit_specializations.md). Head dim 128 and pages of 16 take the sm_90 kernels an 8B Llama
    takes."""
    save_tiny_llama(tmp_path, 97, VOCAB, hidden_size=256, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=128)  # fmt: skip
    llm = LLM(str(tmp_path), device="cuda", dtype=torch.bfloat16, page_size=16, num_pages=4096,
              max_num_batched_tokens=384, max_num_seqs=40)  # fmt: skip
    steps, compiled = _serve_waves_compiles(llm, 12)
    assert steps > 50 and not compiled, compiled


@pytest.mark.gpu
def test_deepseek_serving_compiles_no_kernel_after_start_up(tmp_path):
    """The same for DeepSeek's MLA at V2-Lite's attention geometry (16 heads, kv_lora_rank
    512, rope 64: the sm_90 MLA kernels, pages of 64): decodes beside a chunk its attention
    expands attend as a one-token batch of their own at the eager table width, which the
    warm-up's chunks of 9 tokens cover (`warm_up_chunk_lengths`; before them, 4 compiles of
    `_mla_decode_sm90_t` in bench-serve's first 41 steps on an H200)."""
    import transformers

    cfg = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=384, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=64,
        v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(98)
    hf = transformers.DeepseekV3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    hf.save_pretrained(tmp_path)
    del hf
    llm = LLM(str(tmp_path), device="cuda", dtype=torch.bfloat16, page_size=64, num_pages=512,
              max_num_batched_tokens=384, max_num_seqs=40)  # fmt: skip
    steps, compiled = _serve_waves_compiles(llm, 13)
    assert steps > 50 and not compiled, compiled


@pytest.mark.gpu
def test_token_ring_never_overwrites_unread_tokens():
    """A slot reused before its step's tokens were read (depth 1): `claim` reads them first,
    so both steps keep their own tokens."""
    from pagedattn.engine.inflight import InFlightStep, TokenRing

    ring = TokenRing(depth=1)
    a = torch.arange(5, device="cuda") * 3
    b = torch.arange(7, device="cuda") + 100
    fa = InFlightStep([], a, ring)
    fb = InFlightStep([], b, ring)  # the same pinned slot
    assert fb.tokens() == b.tolist()
    assert fa.tokens() == a.tolist()
