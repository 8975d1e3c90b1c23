"""`SamplingParams.stop`: stop strings on the shipped checkpoint (its BPE tokenizer: tokens of
several characters, strings that span tokens), on the CPU. Each stop string is cut from the
greedy text of the same prompt without stops, so where it must end the text is known: the text
ends right before the earliest match (or after it with include_stop_str_in_output), the tokens
are the run's up to the one that completed it, streamed deltas add up to the final text and
never show what it cuts, with and without async scheduling and under preemption."""

from __future__ import annotations

import pytest
import torch

from pagedattn.demo import DEFAULT_MODEL
from pagedattn.engine import LLM, SamplingParams
from pagedattn.errors import InvalidArgumentError

PROMPTS = ["def walk(top):", "class Queue:\n    def put(self, item):", "import os\n"]
N = 48


@pytest.fixture(scope="module")
def llm():
    return LLM(str(DEFAULT_MODEL), device="cpu", dtype=torch.float32, page_size=16,
               num_pages=256)  # fmt: skip


@pytest.fixture(scope="module")
def greedy(llm):
    """Each prompt's greedy (text, token_ids) without stop strings."""
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=N, temperature=0, ignore_eos=True))
    return [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outs]


def _stops(text: str, n: int, width: int, gen: torch.Generator, after: int = 2):
    """Up to n (position, string) of `width` characters first found at that position (past
    `after`) of `text`, at random positions."""
    spots = [i for i in range(after, len(text) - width) if text.find(text[i : i + width]) == i]
    pick = torch.randperm(len(spots), generator=gen)[:n].tolist()
    return [(spots[k], text[spots[k] : spots[k] + width]) for k in sorted(pick)]


def _params(stop, include=False):
    return SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, stop=stop,
                          include_stop_str_in_output=include)  # fmt: skip


@pytest.mark.parametrize("width", [1, 4])
def test_text_ends_before_the_stop_string(llm, greedy, width, gen):
    tok = llm.tokenizer
    for (text, toks), prompt in zip(greedy, PROMPTS):
        for at, s in _stops(text, 2, width, gen):
            for include in (False, True):
                o = llm.generate([prompt], _params([s], include))[0].outputs[0]
                assert o.text == text[: at + (len(s) if include else 0)], (prompt, s, include)
                assert o.finish_reason == "stop" and o.stop_reason == s
                got = list(o.token_ids)
                assert got == toks[: len(got)]  # the same run, cut
                assert s in tok.decode(got) and s not in tok.decode(got[:-1])


def test_the_earliest_of_several_stop_strings_wins(llm, greedy, gen):
    text, _ = greedy[1]
    (a, sa), (b, sb) = _stops(text, 2, 4, gen)  # a < b
    o = llm.generate([PROMPTS[1]], _params([sb, sa]))[0].outputs[0]
    assert o.text == text[:a] and o.stop_reason == sa
    o = llm.generate([PROMPTS[1]], _params([sb, "never there " * 3]))[0].outputs[0]
    assert o.text == text[:b] and o.stop_reason == sb
    o = llm.generate([PROMPTS[1]], _params(["never there " * 3]))[0].outputs[0]
    assert o.text == text and o.finish_reason == "length" and o.stop_reason is None


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_streamed_deltas_add_up_and_show_nothing_cut(greedy, async_scheduling, gen):
    """Every request of one stream with its own stops (one of them never matching, the other
    in the second half of its text), a pool too small for all three at once (preemption) and
    a small token budget (chunked prefill)."""
    llm = LLM(str(DEFAULT_MODEL), device="cpu", dtype=torch.float32, page_size=4,
              num_pages=16, max_num_batched_tokens=16,
              async_scheduling=async_scheduling)  # fmt: skip
    cases = []
    for (text, _), prompt in zip(greedy, PROMPTS):
        late = _stops(text, 1, 3, gen, after=len(text) * 2 // 3) or _stops(text, 1, 3, gen)
        (at, s), = late  # fmt: skip
        cases.append((prompt, [s, "~~~"], text[:at]))
    params = [_params(stops) for _, stops, _ in cases]
    sent = ["" for _ in cases]
    final = [None for _ in cases]
    ids = {}
    for r in llm.stream([p for p, _, _ in cases], params):
        i = ids.setdefault(r.request_id, len(ids))
        o = r.outputs[0]
        sent[i] += o.new_text
        assert o.text == sent[i]
        assert cases[i][2].startswith(sent[i])  # never past the cut
        if r.finished:
            final[i] = o.text
    assert final == [want for _, _, want in cases]
    assert llm.stats().preemptions > 0


def test_bad_stop_values_raise_and_queue_nothing(llm, tmp_path):
    for bad in ("", [""], [3], ["a", None]):
        with pytest.raises(InvalidArgumentError, match=r"^SamplingParams\.stop"):
            SamplingParams(stop=bad)
    with pytest.raises(InvalidArgumentError, match=r"^SamplingParams\.include_stop_str"):
        SamplingParams(stop="x", include_stop_str_in_output=1)
    assert SamplingParams(stop="ab").stop == ("ab",)
    assert SamplingParams(stop=["ab", "cde"]).stop_hold == 2
    assert SamplingParams(stop=["ab"], include_stop_str_in_output=True).stop_hold == 0

    from tiny_llama import save_tiny_llama  # noqa: PLC0415

    save_tiny_llama(tmp_path, 3, 64)  # a checkpoint without a tokenizer
    bare = LLM(str(tmp_path), device="cpu", dtype=torch.float32, num_pages=64)
    with pytest.raises(InvalidArgumentError, match=r"^SamplingParams\.stop.*tokenizer"):
        bare.add_request({"prompt_token_ids": [1, 2, 3]}, SamplingParams(stop=["x"]))
    assert bare.num_unfinished_requests == 0 and not bare.has_unfinished_requests()
