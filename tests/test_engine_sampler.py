"""The engine's sampler against the definitions of temperature, top-k and top-p.

Each case draws 20,000 tokens from a vocabulary of 8 with fixed seeds (so the test is
deterministic) and compares the counts with the distribution the definition gives (computed
here independently, in plain Python) by a chi-square test; tokens outside the definition's
support must never appear. Also: greedy rows, reproducibility (the same seed gives the same
tokens, alone or in any batch, and through the engine, preemptions included), and the
uniformity of the counter-based noise.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_engine_fakes import VOCAB, HistoryModel
from test_engine_scheduler import make_llm, prompt_of

from pagedattn.engine import SamplingParams, SamplingTensors, sample
from pagedattn.engine.sampler import uniform_noise

N = 20_000
LOGITS = torch.tensor([1.3, -0.4, 2.2, 0.1, 0.9, -1.5, 1.8, 0.5])
ALPHA = 1e-3


def chi2_pvalue(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    stat = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))  # fmt: skip


def expected(logits: list[float], temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The definition, step by step: scale, keep the top k, keep the shortest head of the
    ranking whose (renormalised) mass reaches top_p, renormalise."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda j: -scaled[j])
    kept = order[:top_k] if top_k else order

    def softmax(idx):
        m = max(scaled[j] for j in idx)
        e = {j: math.exp(scaled[j] - m) for j in idx}
        z = sum(e.values())
        return {j: v / z for j, v in e.items()}

    probs = softmax(kept)
    if top_p < 1:
        head, mass = [], 0.0
        for j in kept:
            if mass >= top_p:
                break
            head.append(j)
            mass += probs[j]
        kept = head
    return softmax(kept)


def draw(params: SamplingParams, seeds, counters) -> torch.Tensor:
    n = len(seeds)
    st = SamplingTensors.build([params] * n, seeds, counters, len(LOGITS), "cpu")
    return sample(LOGITS.expand(n, -1).contiguous(), st)


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=2.5),
    dict(temperature=1.0, top_k=3),
    dict(temperature=1.3, top_p=0.6),
    dict(temperature=0.8, top_k=5, top_p=0.8),
    dict(temperature=1.0, top_p=0.97),
    dict(temperature=1.0, top_k=1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("stream", ["seeds", "counters"])
def test_distribution_matches_definition(case, stream):
    """`seeds`: 20k requests (seeds 0..N-1) drawing their first token; `counters`: one request
    (seed 12345) drawing 20k successive tokens."""
    params = SamplingParams(**case)
    if stream == "seeds":
        tokens = draw(params, list(range(N)), [0] * N)
    else:
        tokens = draw(params, [12345] * N, list(range(N)))
    want = expected(LOGITS.tolist(), params.temperature, params.top_k, params.top_p)
    counts = torch.bincount(tokens, minlength=len(LOGITS)).tolist()
    outside = {j: c for j, c in enumerate(counts) if j not in want and c}
    assert not outside, f"tokens outside the support drawn: {outside}"
    support = sorted(want)
    if len(support) == 1:
        assert counts[support[0]] == N
        return
    p = chi2_pvalue([counts[j] for j in support], [want[j] for j in support])
    print(f"{case} {stream}: chi-square p = {p:.3f}")
    assert p > ALPHA, f"chi-square p = {p:.2e}: counts {counts}, expected {want}"


def test_greedy_rows_and_mixed_batches():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    ps = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=2)] * 3
    st = SamplingTensors.build(ps, list(range(6)), [0] * 6, 40, "cpu")
    out = sample(logits, st)
    top2 = logits.topk(2).indices
    for i in range(6):
        if i % 2 == 0:
            assert out[i] == logits[i].argmax()
        else:
            assert out[i] in top2[i]
    st = SamplingTensors.build([SamplingParams(temperature=0.0)] * 6, [0] * 6, [0] * 6, 40, "cpu")
    assert st.all_greedy and torch.equal(sample(logits, st), logits.argmax(-1))
    empty = SamplingTensors.build([], [], [], 40, "cpu")
    assert sample(torch.zeros(0, 40), empty).shape == (0,)


def test_staged_parameters_equal_the_copied_ones():
    """The engine's staging of the sampled rows' parameters (one packed copy) gives the same
    tensors as a copy each, seeds of 63 bits included."""
    from pagedattn.cache.buffers import StagingRing

    ps = [SamplingParams(temperature=0.5, top_k=3, top_p=0.9), SamplingParams(temperature=0.0),
          SamplingParams(temperature=1.5)]  # fmt: skip
    seeds, counters = [2**63 - 1, 0, 12345], [7, 0, 2**32 - 1]
    a = SamplingTensors.build(ps, seeds, counters, 40, "cpu")
    b = SamplingTensors.build(ps, iter(seeds), iter(counters), 40, "cpu", StagingRing("cpu").stage)
    for name in ("temperature", "top_k", "top_p", "seeds", "counters"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.all_greedy, a.any_top_k, a.any_top_p) == (b.all_greedy, b.any_top_k, b.any_top_p)


def test_same_seed_same_tokens_whatever_the_batch():
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=0.9, top_p=0.9)
    seeds, counters = [7, 8, 7, 2**63 - 1, 0], [3, 3, 3, 9, 0]
    st = SamplingTensors.build([p] * 5, seeds, counters, 64, "cpu")
    a = sample(logits, st)
    assert torch.equal(a, sample(logits, st))
    for i in range(5):  # each row alone
        one = SamplingTensors.build([p], seeds[i : i + 1], counters[i : i + 1], 64, "cpu")
        assert sample(logits[i : i + 1], one).item() == a[i].item()
    u = uniform_noise(torch.tensor(seeds), torch.tensor(counters), 64)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert float(u.min()) > 0 and float(u.max()) < 1


def test_noise_is_uniform():
    u = uniform_noise(torch.arange(2000), torch.zeros(2000, dtype=torch.int64), 64).flatten()
    counts = torch.histc(u, bins=32, min=0, max=1).long().tolist()
    assert chi2_pvalue(counts, [1 / 32] * 32) > ALPHA
    # Neighbouring columns and rows are uncorrelated.
    u2 = uniform_noise(torch.arange(2000), torch.zeros(2000, dtype=torch.int64), 64)
    c_cols = torch.corrcoef(torch.stack([u2[:, :-1].flatten(), u2[:, 1:].flatten()]))[0, 1]
    c_rows = torch.corrcoef(torch.stack([u2[:-1].flatten(), u2[1:].flatten()]))[0, 1]
    assert abs(float(c_cols)) < 0.01 and abs(float(c_rows)) < 0.01


def test_engine_seeded_sampling_is_reproducible():
    """The same seed gives the same tokens twice: in another engine, in another batch, and
    under preemption (tokens are never redrawn)."""
    prompts = [prompt_of(n, 40 + n) for n in (6, 11, 4, 9)]

    def seeded(base):
        return [
            SamplingParams(max_tokens=8, temperature=1.0, top_k=20, seed=base + i) for i in range(4)
        ]

    params = seeded(100)
    reqs = [{"prompt_token_ids": p} for p in prompts]
    a = [o.outputs[0].token_ids for o in make_llm().generate(reqs, params)]
    b = [o.outputs[0].token_ids for o in make_llm().generate(reqs, params)]
    assert a == b
    squeezed = make_llm(HistoryModel(), num_pages=10, max_num_batched_tokens=5)
    c = [o.outputs[0].token_ids for o in squeezed.generate(reqs, params)]
    assert squeezed.stats().preemptions > 0 and c == a
    alone = [make_llm().generate([r], p)[0].outputs[0].token_ids for r, p in zip(reqs, params)]
    assert alone == a
    d = [o.outputs[0].token_ids for o in make_llm().generate(reqs, seeded(200))]
    assert d != a
    # Without seeds: the engine's seed decides (same engine seed, same order: same tokens).
    free = [SamplingParams(max_tokens=8, temperature=1.0)] * 4
    e1 = [o.outputs[0].token_ids for o in make_llm(seed=3).generate(reqs, free)]
    e2 = [o.outputs[0].token_ids for o in make_llm(seed=3).generate(reqs, free)]
    e3 = [o.outputs[0].token_ids for o in make_llm(seed=4).generate(reqs, free)]
    assert e1 == e2 and e1 != e3
    assert all(0 <= t < VOCAB for toks in a + e1 for t in toks)


def test_chi_square_has_power():
    """The same draws fail against a slightly wrong definition (temperature 0.6 vs 0.7, top-p
    0.8 vs no top-p): the test above would catch such errors."""
    t = draw(SamplingParams(temperature=0.6), list(range(N)), [0] * N)
    counts = torch.bincount(t, minlength=len(LOGITS)).tolist()
    wrong = expected(LOGITS.tolist(), 0.7, 0, 1.0)
    assert chi2_pvalue(counts, [wrong[j] for j in range(len(LOGITS))]) < 1e-6
    t = draw(SamplingParams(temperature=1.0, top_p=0.97), list(range(N)), [0] * N)
    counts = torch.bincount(t, minlength=len(LOGITS)).tolist()
    full = expected(LOGITS.tolist(), 1.0, 0, 1.0)
    assert min(counts) == 0 and min(full.values()) * N > 50  # a token top-p drops


@pytest.mark.gpu
def test_greedy_argmax_compiles_nothing_after_warm_up():
    """After `warm_up(vocab)`, the greedy argmax and the draws of any batch size, with top-k
    and top-p too, compile no kernel (their spans, `argmax_plan`, change with the batch: a
    compile in the middle of serving stalls a step for ~0.3-5 s); the argmax equals
    torch.argmax."""
    from pagedattn.engine.sampler import warm_up
    from pagedattn.ops.fused import argmax_rows, sample_rows
    from pagedattn.ops.launch import jit_compiles

    V = 50000
    warm_up(V, "cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    with jit_compiles() as compiled:
        for n in (1, 2, 7, 16, 33, 64, 100, 255, 256, 263, 264, 300, 1000):
            x = torch.randn(n, V, device="cuda", generator=g)
            assert torch.equal(argmax_rows(x), x.argmax(-1)), n
            t = torch.rand(n, device="cuda", generator=g)
            seeds = torch.randint(0, 2**62, (n,), device="cuda", generator=g)
            drawn = sample_rows(x, t, seeds, seeds)
            assert drawn.shape == (n,) and bool(((drawn >= 0) & (drawn < V)).all())
            k = torch.randint(0, V + 2, (n,), device="cuda", generator=g)
            drawn = sample_rows(x, t, seeds, seeds, top_k=k, top_p=t)  # the sampler's form
            assert drawn.shape == (n,) and bool(((drawn >= 0) & (drawn < V)).all())
    assert not compiled, compiled
