"""Piecewise CUDA graphs for steps with prefill chunks (engine/mixed_graphs.py), on tiny random
checkpoints (Llama, Mistral with a sliding window, Qwen3 with q/k norms and a sliding layer,
Qwen2-MoE and gpt-oss with their experts as grouped matmuls on the CPU, DeepSeek-V3 with its
MLA attention and experts).

CPU: the pieces emulated (`MixedGraphRunner(emulate=True)`: the static buffers, the padding to
a token bucket, the pad row that owns the pad tokens, each layer's attention on the step's own
inputs through the model's hook) give the eager engine's greedy tokens and, step by step, its
logits (within float32 roundings: the padded rows change this CPU's matmul blocking), over
ragged prompts, shared prefixes, chunked prefill, decodes mixed with chunks and every bucket;
after each replay the buffers hold the step and padding only, and a replay writes no page but
the step's and the pad page; a replay equals a fresh eager call of the same step; buckets;
which models get pieces; the hook's typed error.

GPU (`-m gpu`): the engine with captured pieces against `enforce_eager=True` on a tiny bf16
Llama and DeepSeek (plain and FP8 weights) (tokens equal up to bf16 ties), and every replay
against a fresh eager call (Llama's made under `torch.cuda.set_sync_debug_mode("error")`: no
host sync).
"""

from __future__ import annotations

import pytest
import torch
from test_engine_cuda_graphs import (
    SAVERS,
    VOCAB,
    EmulatedLLM,
    close,
    graph_vs_eager,
    replays_vs_eager,
    same,
)
from tiny_llama import randomize_, save_tiny_deepseek, save_tiny_llama, tiny_common

from pagedattn.engine import LLM, SamplingParams
from pagedattn.engine.cuda_graphs import PAD_REQUEST
from pagedattn.engine.mixed_graphs import mixed_buckets, supports_piecewise_graphs
from pagedattn.errors import InvalidArgumentError

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# buckets (16, 40): chunks of up to 40 tokens, pad tokens up to 24 of a step
KW = dict(page_size=4, num_pages=96, max_num_batched_tokens=40, max_num_seqs=8)


def save_arch(path, arch: str, seed: int) -> None:
    if arch == "llama":
        save_tiny_llama(path, seed, VOCAB)
        return
    torch.manual_seed(seed)
    common = tiny_common(VOCAB)
    if arch == "mistral":
        cfg = transformers.MistralConfig(**common, intermediate_size=96, num_attention_heads=4,
                                         num_key_value_heads=1, sliding_window=8)  # fmt: skip
        cls = transformers.MistralForCausalLM
    else:
        cfg = transformers.Qwen3Config(**common, intermediate_size=96, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=16, use_sliding_window=True,
                                       sliding_window=12, max_window_layers=1)  # fmt: skip
        cls = transformers.Qwen3ForCausalLM
    hf = cls._from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        randomize_(hf)
    hf.save_pretrained(path)


@pytest.fixture(
    scope="module", params=["llama", "mistral", "qwen3", "qwen2_moe", "gpt_oss", "deepseek"]
)
def ckpt(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}_mixed")
    if request.param in SAVERS:  # (the MoE families: test_engine_cuda_graphs' savers)
        SAVERS[request.param](path, 864, VOCAB)
    else:
        save_arch(path, request.param, 864)
    return str(path)


def workload():
    """Ragged prompts (shared prefixes, chunks cut by the 40-token budget), a few decodes each,
    and a second wave arriving while the first decodes (decodes mixed with chunks)."""
    g = torch.Generator().manual_seed(9)
    base = torch.randint(0, VOCAB, (23,), generator=g).tolist()
    first = [base, base[:16] + [1, 2, 3], torch.randint(0, VOCAB, (57,), generator=g).tolist(),
             [5], torch.randint(0, VOCAB, (9,), generator=g).tolist()]  # fmt: skip
    second = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (31, 3, 45)]
    second.append(base + [7])
    return first, [9, 4, 6, 12, 3], second, [5, 8, 2, 6]


class Recorder:
    """Wraps the runner: per step its sampling request ids, whether the pieces served it and a
    copy of its logits; after each piece replay, checks the buffers' padding and which pages
    the replay wrote."""

    def __init__(self, llm) -> None:
        self.llm, self.runner = llm, llm.runner
        self.steps: list[tuple[list, bool, torch.Tensor]] = []

    def execute(self, inputs):
        m = self.runner.mixed
        served = m is not None and m.serves(inputs) and not self.runner.graphs.serves(inputs)
        blocks = inputs.kv_inputs[0].kv_blocks
        before = blocks.clone() if served else None
        out = self.runner.execute(inputs)
        ids = [inputs.request_ids[i] for i in inputs.sample_index]
        self.steps.append((ids, served, out.detach().cpu().clone()))
        if served:
            check_padding(m, inputs)
            mgr = self.llm.manager
            mine = {p for rid in inputs.request_ids for p in mgr.pages(rid)}
            a, b = blocks.view(torch.uint8), before.view(torch.uint8)  # (NaN-safe: bytes)
            changed = {p for p in range(a.shape[0]) if not torch.equal(a[p], b[p])}
            assert changed  # (the step wrote its K/V)
            extra = changed - mine - {self.runner.graphs.pad_page}
            assert not extra, (sorted(extra), inputs.request_ids, inputs.num_tokens)
        return out


def check_padding(m, inputs) -> None:
    """The buffers after a replay: the step's rows, then pad rows; row M owns the pad tokens."""
    s, n, T = m.buffers, inputs.batch_size, inputs.num_tokens
    M, tb = s.max_requests, m.bucket(T)
    offs = s.q_row_offsets.cpu()
    assert torch.equal(offs[: n + 1], inputs.q_row_offsets.cpu())
    assert (offs[n + 1 : M + 1] == T).all() and int(offs[M + 1]) == tb
    assert not s.input_ids[T:].any() and not s.positions[T:].any()
    R = len(inputs.sample_index)
    assert torch.equal(s.logits_rows[:R], inputs.logits_rows) and not s.logits_rows[R:].any()
    g = m_decode_pad(m)
    assert torch.equal(s.kv.lookup_table[n:M].cpu(), g[0].expand(M - n, -1))
    assert not s.kv.cache_lengths[n:].any()
    assert (s.kv.lookup_table[M] == g[1]).all()


def m_decode_pad(m):
    s = m.buffers
    return s.pad_lookup_row.cpu(), int(s.kv.lookup_table[s.max_requests, 0])


def run(llm, first, m1, second, m2, *, at: int = 4):
    """Greedy tokens of the first wave, the second added before step `at`; (tokens of every
    request in id order, Recorder)."""
    # a fresh pool's bytes may be an earlier engine's, which served the same steps: poisoned
    # (NaN) so that every page a replay writes changes
    llm.manager._buffers[0].kv_blocks.fill_(float("nan"))
    rec = Recorder(llm)
    llm.runner = rec
    sp = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in m1 + m2]
    ids = [llm.add_request({"prompt_token_ids": p}, s) for p, s in zip(first, sp)]
    out: dict[int, list[int]] = {}
    step = 0
    try:
        while llm.has_unfinished_requests() or step <= at:
            if step == at:
                ids += [llm.add_request({"prompt_token_ids": p}, s)
                        for p, s in zip(second, sp[len(first):])]  # fmt: skip
            for o in llm.step():
                out.setdefault(o.request_id, []).extend(o.outputs[0].new_token_ids)
            step += 1
    finally:
        llm.runner = rec.runner
    return [out[i] for i in ids], rec


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_emulated_pieces_give_the_eager_tokens_and_logits(ckpt, async_scheduling):
    eager = LLM(ckpt, device="cpu", dtype=torch.float32, **KW)
    emu = EmulatedLLM(ckpt, device="cpu", dtype=torch.float32,
                      async_scheduling=async_scheduling, **KW)  # fmt: skip
    m = emu.runner.mixed
    assert eager.runner.mixed is None and m is not None and m.buckets == (16, 40)
    args = workload()
    want, rec_e = run(eager, *args)
    got, rec_g = run(emu, *args)
    assert got == want
    assert [len(t) for t in got] == args[1] + args[3]
    assert len(rec_g.steps) == len(rec_e.steps)
    for (ids_g, served, lg), (ids_e, _, le) in zip(rec_g.steps, rec_e.steps):
        assert ids_g == ids_e
        same(lg, le, exact=False, what=f"step of {ids_g} (pieces: {served})")
    sizes = [i for i, (_, s, _) in enumerate(rec_g.steps) if s]
    assert m.num_replays == len(sizes) >= 4
    assert emu.runner.graphs.num_replays >= 5  # the decode graphs still serve pure decodes
    assert emu.manager.request_ids == [PAD_REQUEST]


def buckets_vs_eager(llm, prompts, max_tokens, compare, *, no_sync: bool = False) -> list[int]:
    """Each step the pieces serve, replayed, then run eagerly on the same inputs
    (`replays_vs_eager`), `compare(replayed, eager)`; returns the buckets replayed."""
    m = llm.runner.mixed
    seen = replays_vs_eager(llm, prompts, max_tokens, m, lambda _, a, b: compare(a, b),
                            no_sync=no_sync)  # fmt: skip
    return [m.bucket(inputs.num_tokens) for inputs in seen]


def test_emulated_replay_equals_a_fresh_eager_call(ckpt):
    """Each step the pieces serve, replayed, then run eagerly on the same inputs: the same
    logits within float32 roundings; every bucket replays."""
    emu = EmulatedLLM(ckpt, device="cpu", dtype=torch.float32, **KW)
    first, m1, second, m2 = workload()
    buckets = buckets_vs_eager(emu, first + second, m1 + m2,
                               lambda a, b: same(a, b, exact=False, what="replay"))  # fmt: skip
    assert set(buckets) == {16, 40} and len(buckets) >= 4


def test_mixed_buckets():
    assert mixed_buckets(1) == (1,)
    assert mixed_buckets(40) == (16, 40)
    assert mixed_buckets(512) == (16, 64, 256, 512)
    assert mixed_buckets(2048) == (16, 64, 256, 512, 1024, 1536, 2048)
    assert mixed_buckets(8192)[-3:] == (7168, 7680, 8192)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        mixed_buckets(0)


def test_which_models_get_pieces(tmp_path):
    save_tiny_llama(tmp_path / "llama", 3, VOCAB)
    save_tiny_deepseek(tmp_path / "ds", 3, VOCAB)
    llama = EmulatedLLM(str(tmp_path / "llama"), device="cpu", dtype=torch.float32, **KW)
    assert supports_piecewise_graphs(llama.model) and llama.runner.mixed is not None
    eager = EmulatedLLM(str(tmp_path / "llama"), device="cpu", dtype=torch.float32,
                        enforce_eager=True, **KW)  # fmt: skip
    assert eager.runner.mixed is None

    class NoPieces(EmulatedLLM):  # (the probes' A/B switch)
        _piecewise_graphs = False

    off = NoPieces(str(tmp_path / "llama"), device="cpu", dtype=torch.float32, **KW)
    assert off.runner.mixed is None and off.runner.graphs is not None
    ds = EmulatedLLM(str(tmp_path / "ds"), device="cpu", dtype=torch.float32, **KW)
    assert supports_piecewise_graphs(ds.model) and ds.runner.mixed is not None
    assert ds.runner.graphs is not None
    # a hook on a model whose steps are not captured in pieces: a typed error, before any work
    type(llama.model).supports_piecewise_graphs = False  # (the class's: restored below)
    try:
        assert not supports_piecewise_graphs(llama.model)
        (inp,) = llama.manager.runtime_inputs([PAD_REQUEST])
        one = torch.zeros(1, dtype=torch.int64)
        with pytest.raises(InvalidArgumentError, match="attention_hook"):
            llama.model(one, one, inp, torch.tensor([0, 1], dtype=torch.int32), one,
                        attention_hook=lambda q, *a, **k: q)  # fmt: skip
    finally:
        del type(llama.model).supports_piecewise_graphs


def test_fp8_branch_steps_stay_eager(tmp_path):
    """DeepSeek with the fused FP8 branch: a step whose every request has at most
    MLA_ABSORBED_MAX_Q queries stays eager (its eager attention takes the branch, whose
    products round otherwise than the pieces' plain attention); a longer request makes it a
    pieces step. Plain weights (no branch): every step."""
    from test_models_deepseek import _fp8_checkpoints

    from pagedattn.models import load_model
    from pagedattn.models.deepseek import MLA_ABSORBED_MAX_Q as K

    fp8, deq = _fp8_checkpoints(tmp_path)
    m8, md = load_model(fp8), load_model(deq)
    assert m8.model.layers[0].self_attn.takes_branch
    assert m8.serves_in_pieces([0, 1, 2, 2 + K]) is False
    assert m8.serves_in_pieces([0, 1, 3 + K]) is True
    assert md.serves_in_pieces([0, 1, 2, 2 + K]) is True


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "deepseek", "deepseek_fp8"])
def test_pieces_match_eager_on_cuda(family, tmp_path):
    """deepseek_fp8: FP8 block weights (the decode graphs take the fused FP8 MLA branch; the
    pieces the plain MLA attention between them). DeepSeek's replays read the step's query
    counts on the host (its MLA plan), as its eager steps do: the no-sync check is Llama's."""
    if family == "deepseek_fp8":
        from test_models_deepseek import _fp8_checkpoints

        path = _fp8_checkpoints(tmp_path)[0]
    else:
        path = tmp_path
        SAVERS[family](tmp_path, 1357, VOCAB)
    kw = dict(device="cuda", dtype=torch.bfloat16, **KW)
    graph = LLM(str(path), **kw)
    m = graph.runner.mixed
    assert m is not None and not m.emulate and sorted(m.captured) == [16, 40]
    L = graph.model.config.num_layers
    assert all(len(b.pieces) == L + 1 and len(b.calls) == L
               and all(isinstance(p, torch.cuda.CUDAGraph) for p in b.pieces)
               for b in m.captured.values())  # fmt: skip
    eager = LLM(str(path), enforce_eager=True, **kw)
    args = workload()
    rec_g, rec_e, served = graph_vs_eager(graph, eager, run, args, "pieces served")
    assert m.num_replays == len(served) >= 4
    close(rec_g.steps[0][2], rec_e.steps[0][2])  # the first step: both from the same cache

    first, m1, second, m2 = args
    # other tokens than the first run's (whose pages the prefix cache would give back)
    prompts = [[(t + 1) % VOCAB for t in p] for p in first + second]
    buckets = buckets_vs_eager(graph, prompts, m1 + m2, close, no_sync=family == "llama")
    if family == "deepseek_fp8":  # (steps of short requests only stay eager: the FP8 branch)
        assert 40 in buckets and set(buckets) <= {16, 40}
    else:
        assert set(buckets) == {16, 40}
    del graph, eager
    torch.cuda.empty_cache()
