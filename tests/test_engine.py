"""The engine end to end on a real model: a tiny random Llama written with `save_pretrained`
(float32, CPU) and a word-level tokenizer saved beside it.

- `LLM.generate` greedy == transformers' `generate(do_sample=False)` for each prompt alone, on
  ragged prompts with shared prefixes, with chunked prefill forced by a small
  `max_num_batched_tokens` and preemption forced by a small `num_pages` (a token may differ
  only where HF's top-2 logits tie, gap < 1e-4: reported as a warning, compared up to there);
- text prompts go through the checkpoint's tokenizer, outputs carry text, the stream's deltas
  add up to the final output;
- per-request metrics (TTFT, TPOT) and engine stats (throughput, prefix hit rate, pages).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_llama import save_tiny_llama

from pagedattn.engine import LLM, SamplingParams

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 256
TIE_GAP = 1e-4
NEW = 8


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    hf = save_tiny_llama(path, 4321, VOCAB)
    # A word-level tokenizer: "w0" .. "w253" plus [UNK] and <eos> (ids 254, 255).
    words = {f"w{i}": i for i in range(VOCAB - 2)} | {"[UNK]": VOCAB - 2, "<eos>": VOCAB - 1}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    raw.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="<eos>"
    )
    fast.save_pretrained(path)
    return str(path), hf


@torch.no_grad()
def hf_greedy(hf, prompt: list[int], max_new: int):
    dev = next(hf.parameters()).device
    out = hf.generate(
        torch.tensor([prompt], device=dev),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=dev),
        max_new_tokens=max_new,
        min_new_tokens=max_new,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.stack([s[0] for s in out.logits]).cpu()


def compare(ours: list[list[int]], truth) -> int:
    ties = 0
    for i, (got, (want, logits)) in enumerate(zip(ours, truth)):
        assert len(got) == len(want)
        for j, (a, b) in enumerate(zip(got, want)):
            if a != b:
                top2 = logits[j].topk(2).values
                gap = float(top2[0] - top2[1])
                assert gap < TIE_GAP, f"request {i} token {j}: {a} != HF {b} (gap {gap:.3g})"
                warnings.warn(f"request {i} token {j}: HF top-2 tie (gap {gap:.1e})", stacklevel=2)
                ties += 1
                break
    return ties


def prompts_of(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_generate_greedy_matches_hf_with_chunks_preemption_and_shared_prefixes(
    ckpt, async_scheduling
):
    path, hf = ckpt
    base = prompts_of([23], 1)[0]
    other = prompts_of([5, 3, 9], 2)
    prompts = [
        base,
        base[:13] + other[0],  # shares 3 pages of 4 with base
        base + other[1],  # extends base
        other[2],
        base[:1],
        base[:8],  # a pure prefix
        base[:13] + other[0][:2],
    ]
    llm = LLM(path, device="cpu", dtype=torch.float32, page_size=4, num_pages=16,
              max_num_batched_tokens=16, max_num_seqs=8,
              async_scheduling=async_scheduling)  # fmt: skip
    assert llm.max_model_len == 64
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.prompt_token_ids for o in outs] == prompts
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outs)
    ours = [o.outputs[0].token_ids for o in outs]
    ties = compare(ours, [hf_greedy(hf, p, NEW) for p in prompts])
    st = llm.stats()
    print(
        f"steps {st.num_steps}, preemptions {st.preemptions}, prefix hit rate "
        f"{st.prefix_hit_rate:.2f}, deduplicated pages {st.deduplicated_pages}, peak pages "
        f"{st.peak_used_pages}/{st.total_pages}, ties {ties}"
    )
    assert st.preemptions > 0  # the pool (64 tokens) cannot hold the batch
    assert st.peak_used_pages <= 16 and st.total_pages == 16
    assert st.prefix_hit_tokens + 4 * st.deduplicated_pages > 0  # the prefixes were shared
    assert st.generated_tokens == NEW * len(prompts)
    assert llm.manager.request_ids == [] and st.used_pages == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_text_prompts_tokenizer_stream_and_metrics(ckpt, async_scheduling):
    path, hf = ckpt
    tok = transformers.AutoTokenizer.from_pretrained(path)
    llm = LLM(path, device="cpu", dtype=torch.float32, page_size=2, num_pages=32,
              async_scheduling=async_scheduling)  # fmt: skip
    assert VOCAB - 1 in llm.scheduler.eos_token_ids  # the tokenizer's <eos>
    texts = ["w5 w7 w9 w11", "w5 w7 w200"]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate(texts, params)
    for o, t in zip(outs, texts):
        assert o.prompt == t and o.prompt_token_ids == tok.encode(t)
        ids = o.outputs[0].token_ids
        assert o.outputs[0].text == tok.decode(ids, skip_special_tokens=True)
        want, _ = hf_greedy(hf, o.prompt_token_ids, 6)
        assert ids == want
        m = o.metrics
        assert m.ttft is not None and m.ttft >= 0 and m.tpot is not None and m.tpot > 0
        assert m.e2e >= m.ttft and m.num_generated_tokens == 6
    # The stream: deltas add up to the final tokens and text.
    acc_ids: dict[int, list[int]] = {}
    acc_text: dict[int, str] = {}
    finals = {}
    for o in llm.stream(texts, params):
        c = o.outputs[0]
        acc_ids.setdefault(o.request_id, []).extend(c.new_token_ids)
        acc_text[o.request_id] = acc_text.get(o.request_id, "") + c.new_text
        if o.finished:
            finals[o.request_id] = o
    assert len(finals) == 2
    for (rid, o), ref in zip(sorted(finals.items()), outs):
        assert acc_ids[rid] == o.outputs[0].token_ids == ref.outputs[0].token_ids
        assert acc_text[rid] == o.outputs[0].text == ref.outputs[0].text
    st = llm.stats()
    assert st.generation_throughput > 0 and 0 <= st.prefix_hit_rate <= 1
    assert st.prefix_hit_tokens == 4  # the stream hit the pages ("w5 w7") generate cached


def test_streamed_text_is_decoded_incrementally():
    """Streaming deltas decode a short window of tokens, not the whole output, each step (the
    shipped byte-level BPE tokenizer, whose tokens split multi-byte characters): no delta holds
    a partial character (U+FFFD), every text so far is a prefix of the whole decode, the deltas
    add up to it exactly, and no call before the last decodes more than a few tokens."""
    import os

    from test_engine_fakes import HistoryModel

    import pagedattn
    from pagedattn.engine.sequence import Sequence, SequenceStatus

    folder = os.path.join(os.path.dirname(pagedattn.__file__), "assets", "tiny-stdlib")
    llm = LLM(HistoryModel(), tokenizer=folder, page_size=2, num_pages=8)
    text = "naïve café — 東京 ok\n    return x  # ünïcödé " * 4
    ids = llm.tokenizer.encode(text)
    assert len(ids) > 120
    real, sizes = llm.tokenizer.decode, []

    def decode(toks):
        sizes.append(len(toks))
        return real(toks)

    llm.tokenizer.decode = decode
    seq = Sequence(0, [1, 2], SamplingParams(max_tokens=len(ids)), seed=0)
    whole = real(ids)
    deltas = []
    for i, t in enumerate(ids):
        seq.append_token(t)
        if i == len(ids) - 1:
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, "length"
        c = llm._output(seq, delta=True).outputs[0]
        assert "\ufffd" not in c.new_text and whole.startswith(c.text)
        deltas.append(c.new_text)
    assert "".join(deltas) == whole == c.text
    assert sum(1 for d in deltas if d) > len(ids) // 3  # text flows as it comes
    assert max(sizes[:-1]) <= 8 and sizes[-1] == len(ids)  # windows, then the whole once


def test_async_scheduling_samples_the_same_tokens(ckpt):
    """Seeded sampling (temperature, top-k, top-p) with preemption, chunked prefill, EOS and
    stop tokens: the overlapped engine returns exactly the synchronous one's tokens, finish
    reasons and stop reasons (a sample depends only on the request's seed, its token index and
    its logits), and ends with the same empty pool."""
    path, _ = ckpt
    prompts = prompts_of([23, 5, 17, 9, 2, 30], 3)
    params = [
        SamplingParams(max_tokens=12, temperature=0.9, top_k=20, seed=11),
        SamplingParams(max_tokens=9, temperature=1.3, top_p=0.8, seed=12),
        SamplingParams(max_tokens=1, temperature=0.7, seed=13),
        SamplingParams(max_tokens=12, temperature=1.0, stop_token_ids=[3, 4, 5, 6]),
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(max_tokens=12, temperature=2.0, top_k=5, top_p=0.9, seed=14),
    ]
    got = []
    for mode in (False, True):
        llm = LLM(path, device="cpu", dtype=torch.float32, page_size=4, num_pages=11,
                  max_num_batched_tokens=16, max_num_seqs=6, seed=5,
                  async_scheduling=mode)  # fmt: skip
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        got.append([(o.outputs[0].token_ids, o.outputs[0].finish_reason,
                     o.outputs[0].stop_reason) for o in outs])  # fmt: skip
        st = llm.stats()
        assert st.preemptions > 0 and st.used_pages == 0 and llm.manager.request_ids == []
        assert st.generated_tokens == sum(len(t) for t, _, _ in got[-1])
    assert got[0] == got[1]
    assert {r for _, r, _ in got[0]} == {"length", "stop"}


@pytest.mark.gpu
def test_generate_on_cuda_matches_hf(ckpt):
    """The same schedule on CUDA (Triton kernels, float32) against HF on CUDA; the pool sized by
    gpu_memory_utilization; a bfloat16 engine runs the same prompts."""
    path, hf_cpu = ckpt
    hf = hf_cpu.to("cuda")
    try:
        base = prompts_of([23], 1)[0]
        prompts = [base, base[:13] + [7, 8, 9], prompts_of([9], 2)[0], base[:1]]
        params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
        llm = LLM(path, device="cuda", dtype=torch.float32, page_size=4, num_pages=12,
                  max_num_batched_tokens=16)  # fmt: skip
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        assert llm.stats().preemptions > 0
        compare([o.outputs[0].token_ids for o in outs], [hf_greedy(hf, p, NEW) for p in prompts])
        del llm
        llm = LLM(path, device="cuda", dtype=torch.bfloat16, gpu_memory_utilization=0.05)
        total = torch.cuda.get_device_properties(0).total_memory
        assert 0 < llm.manager.total_num_pages * llm.kv_params.bytes_per_page() < 0.05 * total
        sampled = SamplingParams(max_tokens=NEW, temperature=0.8, top_p=0.9, seed=3)
        a = llm.generate([{"prompt_token_ids": p} for p in prompts], sampled)
        b = llm.generate([{"prompt_token_ids": p} for p in prompts], sampled)
        assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
        assert all(len(o.outputs[0].token_ids) == NEW for o in a)
        del llm
    finally:
        hf_cpu.to("cpu")
        torch.cuda.empty_cache()
