"""The sm_90 binaries that serving steps of different layouts launch, as an H200 picks them:
a script that test_sm90_compile runs in a subprocess (this CPU session may run Triton's
interpreter, which does not compile). Prints one JSON line: for each layout, each kernel's
Triton cache hashes (`ops.offline.cache_hash`: the binary a launch runs, found without
compiling).

Layouts: mixed steps of d decodes and n prefill chunks (Llama-3-8B heads, 32/8 d128, bf16,
pages of 16) whose request counts, lookup-table widths and split points differ within one
request-count class (d in 16..31, n in 1..14); and a pure decode step of 16 requests at the
decode graphs' table width (the bucket-16 graph). docs/kernels/jit_specializations.md: each
new binary met while serving was a compile mid-stream (a Gluon prefill variant ~5 s).

And MLA decode (`mla_decode_triton`, bf16 h_q 16, which specializes on its request count, its
query-row count and table stride): the binaries of 1..MLA_MAX one-token requests at table
widths 1 to 40, and of absorbed batches (DeepSeek attends requests of at most 8 queries
together: d = 0..MLA_MAX - 1 decodes beside 1-3 chunks of 2-8 tokens), against those that the
decode graphs' buckets and the engine's warm-up run at start-up: `cuda_graphs.warm_up_steps`
of DeepSeek's expanded chunk length (the decodes beside it attend as a batch of their own) and
of chunks of 2 (attended absorbed with the decodes), and `cuda_graphs.aligned_row_steps`
(absorbed batches of 16k rows). (Until 2026-12-01 the warm-up's chunks were of 2 tokens only:
its one-token batches were not what this checked; and 4 of 120 absorbed layouts whose row
count is a multiple of 16 met a binary no start-up step made.)"""

from __future__ import annotations

import dataclasses
import json

import torch
from sm90_compile import MC, TM, WL, Device, M, offline  # tests/ is on sys.path

from pagedattn import KVCacheParams, PagedOperand
from pagedattn.engine.cuda_graphs import aligned_row_steps, decode_buckets, warm_up_steps
from pagedattn.models.deepseek import MLA_ABSORBED_MAX_Q, DeepseekV3ForCausalLM
from pagedattn.ops.mha import StepPlan
from pagedattn.ops.mha import work_plan as WP
from pagedattn.ops.mla import worklist as MW
from pagedattn.testing import make_paged_cache, ragged_offsets

H_Q, H_KV, D, PAGE = 32, 8, 128, 16
GRAPH_COLS = 512  # the decode graphs' table width (pages of the engine's max_seq_len)
MLA_MAX = 40  # MLA decode counts checked: 1..40 (request-count classes up to 64)
MLA_POOL = 192  # pages of the MLA pool (an engine's is fixed; the kernels take its size)
EXPANDED = max(DeepseekV3ForCausalLM.warm_up_chunk_lengths)  # the warm-up's expanded chunk

# (decodes, chunks, the longest request's cache length: the table's width)
# (2256 keys: a table of 144 columns, a multiple of 16; d 16: a request count that is one)
LAYOUTS = [(17, 1, 2100), (18, 2, 2060), (19, 3, 2170), (16, 2, 2256), (25, 14, 2049),
           (31, 5, 2300)]  # fmt: skip


def with_width(inputs, cols: int):
    """`inputs` with a contiguous lookup table `cols` wide: the first columns of its table,
    the sentinel (the pool's page count) past them, as the graphs' buffers are widened."""
    lut = inputs.lookup_table
    table = torch.full((lut.shape[0], cols), int(inputs.kv_blocks.shape[0]), dtype=lut.dtype)
    n = min(cols, lut.shape[1])
    table[:, :n] = lut[:, :n]
    return dataclasses.replace(inputs, lookup_table=table)


def operands(cache_lens, q_lens, cols=None):
    params = KVCacheParams(torch.bfloat16, 2, H_KV, D, PAGE)
    inputs = make_paged_cache(params, cache_lens, q_lens).inputs
    if cols is not None:
        inputs = with_width(inputs, cols)
    return PagedOperand(inputs, params, 1, "k"), PagedOperand(inputs, params, 1, "v")


def launches(cache_lens, q_lens, num_decodes, cols=None, planned=False):
    """{kernel: cache hash} of one `mha_mixed_triton` step, as on an H200; planned: with a
    step's work plan (made on the device, so always used: the planned decode kernel and
    combine, and the planner)."""
    k, v = operands(cache_lens, q_lens, cols)
    offs = ragged_offsets(q_lens, "cpu")
    q = torch.randn(int(offs[-1]), H_Q, D).to(torch.bfloat16)
    made = []

    def call():
        made.extend(
            offline.capture(
                TM,
                lambda: TM.mha_mixed_triton(
                    q, k, v, offs, num_decodes, plan=StepPlan() if planned else None
                ),
                device_facts=lambda device: Device(True, 132, True),
            )  # fmt: skip
        )

    made.extend(
        offline.capture(
            WP,
            lambda: made.extend(
                offline.capture(MC, lambda: made.extend(offline.capture(WL, call)))
            ),
        )
    )
    return {m.name: offline.cache_hash(m) for m in made}


def mla_binaries(q_lens: list[int], seed: int, cols: int) -> list[str]:
    """The binaries ("kernel hash") of an MLA decode call over requests of `q_lens` queries
    (bf16, h_q 16, pages of 64, a contiguous lookup table `cols` wide) and of its combine, as on
    an H200."""
    g = torch.Generator().manual_seed(seed)
    cl = [int(torch.randint(0, 64 * min(cols, 4) - n, (1,), generator=g)) for n in q_lens]
    params = KVCacheParams(torch.bfloat16, 2, 1, 576, 64, is_mla=True, num_q_heads=16,
                           mla_rope_dim=64)  # fmt: skip
    needed = sum(-(-(c + n) // 64) for c, n in zip(cl, q_lens, strict=True))
    # (a pool of MLA_POOL pages, as an engine's)
    inputs = make_paged_cache(params, cl, q_lens, extra_pages=MLA_POOL - needed).inputs
    kv = PagedOperand(with_width(inputs, cols), params, 1, "k")
    q = torch.randn(sum(q_lens), 16, 576).to(torch.bfloat16)
    offs = ragged_offsets(q_lens, "cpu")
    made = []

    def call():
        made.extend(
            offline.capture(
                M,
                lambda: M.mla_decode_triton(q, kv, offs, d_v=512),
                _use_sm90_path=M.sm90_serves,
                fast_hbm=lambda device: True,
            )  # fmt: skip
        )

    made.extend(offline.capture(MW, call))
    return sorted({f"{m.name} {offline.cache_hash(m)}" for m in made})


def main() -> None:
    g = torch.Generator().manual_seed(0)
    out = {}
    for d, n, longest in LAYOUTS:
        cl = torch.randint(20, 400, (d + n,), generator=g).tolist()
        cl[d // 2] = longest
        out[f"mixed d{d} n{n}"] = launches(cl, [1] * d + [3] * n, d)
        out[f"planned d{d} n{n}"] = launches(cl, [1] * d + [3] * n, d, planned=True)
    # the warm-up's planned pad step of that request-count class (`GraphRunner._pad_step`)
    out["planned warm-up d16 n1"] = launches([0] * 17, [1] * 16 + [2], 16, cols=3, planned=True)
    cl = torch.randint(20, 400, (16,), generator=g).tolist()
    out["graph decode b16"] = launches(cl, [1] * 16, 16, cols=GRAPH_COLS)
    # MLA decode over d decodes: what the decode graphs and the engine's warm-up compile (its
    # steps of d decodes beside a chunk DeepSeek expands, `warm_up_chunk_lengths`: the
    # decodes attend as their own batch; beside a chunk of 2, all attend absorbed, several
    # tokens a request), and what mixed steps of 1..MLA_MAX decodes run
    start = {((1,) * b, GRAPH_COLS) for b in decode_buckets(MLA_MAX)}
    start |= {((1,) * d, w) for d, _, w in warm_up_steps(MLA_MAX, 8192, GRAPH_COLS, 64, EXPANDED)
              if d}  # fmt: skip
    start |= {((1,) * d + (2,) * n, w) for d, n, w in warm_up_steps(MLA_MAX, 8192, GRAPH_COLS, 64)}
    start |= {(q, w) for q in aligned_row_steps(MLA_MAX, 8192, MLA_ABSORBED_MAX_Q)
              for w in (1, 3, GRAPH_COLS)}  # fmt: skip
    widths = [1, 2, 3, 9, 16, 17, 32, 40]
    served = {
        f"{d} x {w}": mla_binaries([1] * d, 1000 + d, w)
        for d in range(1, MLA_MAX + 1)
        for w in (widths[d % 8], widths[(3 * d + 1) % 8])
    }
    g = torch.Generator().manual_seed(5)
    for d in range(MLA_MAX):  # absorbed: d decodes beside 1-3 chunks of 2-8 tokens
        for w in (widths[d % 8], widths[(3 * d + 2) % 8]):
            n = min(int(torch.randint(1, 4, (1,), generator=g)), MLA_MAX - d)
            chunks = torch.randint(2, MLA_ABSORBED_MAX_Q + 1, (n,), generator=g).tolist()
            served[f"{d} + {chunks} x {w}"] = mla_binaries([1] * d + chunks, 2000 + d, w)
    out["mla"] = {
        "start": sorted({h for q, w in sorted(start) for h in mla_binaries(list(q), len(q), w)}),
        "served": served,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
