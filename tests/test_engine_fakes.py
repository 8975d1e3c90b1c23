"""A fake model for the engine tests (imported by tests/test_engine*.py), and its own checks.

`HistoryModel` honours the models' step contract (docs/models.md) with a 1-layer, 1-head cache
of head_dim 2: for each new token it writes K = (token, position) at `cache_length + i` through
the lookup table (as `store_kv` would), and each logits row reads the request's whole history
back from the cache through the lookup table. The logits are a pseudo-random function of that
history (`history_logits`), so a wrong page, slot, position, cache length or lost prefix
changes the tokens, and a read of an unwritten (NaN-poisoned) slot or a position that does not
match raises. `reference_greedy` is the same function on plain Python lists: the engine's
greedy tokens must equal it exactly.
"""

from __future__ import annotations

import hashlib

import torch

from pagedattn.cache.inputs import KVCacheInputsPerDevice
from pagedattn.models import ModelConfig

VOCAB = 50


class FakeModelError(RuntimeError):
    """Raised by HistoryModel when told to fail (fault tests) or when it reads garbage."""


def fake_config(vocab: int = VOCAB, max_pos: int = 4096, eos: list[int] | None = None):
    return ModelConfig.from_hf(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": 2,
            "intermediate_size": 2,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "head_dim": 2,
            "max_position_embeddings": max_pos,
            "eos_token_id": eos,
        }
    )


def history_logits(history: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """[vocab] float32 logits, a pseudo-random function of the whole token history."""
    h = hashlib.sha256(repr(list(history)).encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little") % 2**62)
    return 3.0 * torch.randn(vocab, generator=g)


def reference_greedy(
    prompt: list[int],
    max_tokens: int,
    *,
    stop: tuple[int, ...] = (),
    max_model_len: int = 1 << 30,
    vocab: int = VOCAB,
) -> tuple[list[int], str]:
    """The greedy tokens and finish reason the engine must produce with HistoryModel."""
    out: list[int] = []
    while True:
        t = int(history_logits(prompt + out, vocab).argmax())
        out.append(t)
        if t in stop:
            return out, "stop"
        if len(out) == max_tokens or len(prompt) + len(out) >= max_model_len:
            return out, "length"


class HistoryModel(torch.nn.Module):
    """The fake model (module docstring). `fail_on_call`: the 0-based forward calls that raise
    FakeModelError after writing their K/V (as a model that dies mid-step would)."""

    def __init__(self, vocab: int = VOCAB, max_pos: int = 4096, eos: list[int] | None = None):
        super().__init__()
        self.config = fake_config(vocab, max_pos, eos)
        self.dtype = torch.float32
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # the device
        self.kv_params = None
        self.calls = 0
        self.fail_on_call: set[int] = set()
        self.step_sizes: list[int] = []

    def attach_kv_cache(self, params) -> None:
        self.kv_params = params

    def forward(self, input_ids, positions, kv: KVCacheInputsPerDevice, q_row_offsets, logits_rows):
        call, self.calls = self.calls, self.calls + 1
        ps = self.kv_params.page_size
        blocks = kv.kv_blocks  # [pages, 2, 1, ps, 1, 2]
        lut, cls = kv.lookup_table, kv.cache_lengths.tolist()
        offs = q_row_offsets.tolist()
        ids, pos = input_ids.tolist(), positions.tolist()
        assert len(offs) == len(cls) + 1 and offs[-1] == len(ids)
        self.step_sizes.append(len(ids))
        row_req = []
        for b, cl in enumerate(cls):
            for i in range(offs[b], offs[b + 1]):
                p = cl + i - offs[b]
                if pos[i] != p:
                    raise FakeModelError(f"position {pos[i]} of row {i}, cache says {p}")
                page = int(lut[b, p // ps])
                blocks[page, 0, 0, p % ps, 0] = torch.tensor([ids[i], p], dtype=torch.float32)
                blocks[page, 1, 0, p % ps, 0] = 0.0
                row_req.append(b)
        if call in self.fail_on_call:
            raise FakeModelError(f"injected failure in forward call {call}")
        out = []
        for r in logits_rows.tolist():
            b = row_req[r]
            n = cls[b] + r - offs[b] + 1  # the history up to and including row r
            p = torch.arange(n)
            pages = lut[b, p // ps].long()
            k = blocks[pages, 0, 0, p % ps, 0].cpu()  # [n, 2]
            if not torch.equal(k[:, 1], p.float()):
                raise FakeModelError(f"request {b}: cached positions {k[:, 1].tolist()}")
            out.append(history_logits([int(t) for t in k[:, 0].tolist()], self.config.vocab_size))
        V = self.config.vocab_size
        return torch.stack(out).to(input_ids.device) if out else torch.zeros(0, V)


# --------------------------------------------------------------------------------------------
def test_fake_model_matches_its_reference():
    """One manual step through a real manager: the fake's logits are history_logits."""
    from pagedattn import PagedKVCacheManager
    from pagedattn.engine import build_step_inputs
    from pagedattn.models import kv_cache_params

    m = HistoryModel()
    params = kv_cache_params(m.config, dtype=torch.float32, page_size=3)
    m.attach_kv_cache(params)
    mgr = PagedKVCacheManager(params, total_num_pages=10)
    torch.nn.init.constant_(mgr.buffers[0].kv_blocks, float("nan"))
    prompts = [[1, 2, 3, 4, 5], [7], [9, 9, 9, 9]]
    for i, p in enumerate(prompts):
        mgr.claim(i, p)
        mgr.alloc(i, len(p))
    inp = build_step_inputs(mgr, [(i, p, len(p)) for i, p in enumerate(prompts)], "cpu")
    logits = m(*[getattr(inp, a) for a in ("input_ids", "positions")], inp.kv_inputs[0],
               inp.q_row_offsets, inp.logits_rows)  # fmt: skip
    want = torch.stack([history_logits(p) for p in prompts])
    assert torch.equal(logits, want)
