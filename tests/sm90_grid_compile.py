"""Compile, offline for sm_90, every kernel specialization that the MLA GPU grid
(`test_triton_mla.test_gpu_grid`) launches on an H100: dense / sparse x every cache format x
h_q {1, 16, 20, 64, 128} x s_q {1, 2, 4} x page size {1, 16, 64, 128}, with the grid's batch
(cache lengths 700 and two shorter), sinks, sparse index stride and partition count.

Run without TRITON_INTERPRET (the interpreter does not compile; `test_mla_sm90_compile` runs
this file in a subprocess): `python tests/sm90_grid_compile.py [dense|sparse] [--full]`. Each
launch is captured as an H100 would make it (`ops.offline.capture`, with
`triton_mla._sm90_serves` for the device check); each distinct specialization goes through
the front end (`ops.offline.front_end`), or with --full through ptxas too. Prints one JSON
line: {"cases", "kernels": {name: specializations}, "errors": [{case, kernel, error, cause}]}.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand
from pagedattn.ops import offline
from pagedattn.ops.mla import triton_mla as M
from pagedattn.testing import make_paged_cache, ragged_offsets

E8M0 = torch.float8_e8m0fnu
FORMATS = {  # test_triton_mla.FORMATS: name -> (quantization, d_qk values)
    "bf16": (lambda: None, (576, 512)),
    "fp8_g64_f32": (lambda: KVQuantConfig.blockwise(64), (576, 512)),
    "fp8_g64_e8m0": (lambda: KVQuantConfig.blockwise(64, E8M0), (576, 512)),
    "fp8_g128_e8m0": (lambda: KVQuantConfig.blockwise(128, E8M0), (512,)),
    "fp8_g192_f32": (lambda: KVQuantConfig.blockwise(192), (576,)),
    "fp8_token_f32": (lambda: KVQuantConfig.per_token(), (576, 512)),
    "fp8_per_tensor": (lambda: KVQuantConfig.per_tensor(), (576, 512)),
    "rope_aware": (lambda: KVQuantConfig.mla_rope_aware(), (576, 512)),
    "v32": (lambda: KVQuantConfig.flashmla_v32(), (576,)),
    "model1": (lambda: KVQuantConfig.flashmla_model1(), (512,)),
}


def grid_launches(mode, fmt, d_qk, h_q, s_q, ps):
    """The launches of the grid case (`test_triton_mla._gpu_case`'s shapes; values random)."""
    params = KVCacheParams(
        torch.bfloat16, 2, 1, d_qk, ps, is_mla=True, num_q_heads=h_q,
        quantization=FORMATS[fmt][0](), mla_rope_dim=64,
    )  # fmt: skip
    q_lens = [s_q] * 3
    pc = make_paged_cache(params, [700, 399, 17], q_lens)
    kv = PagedOperand(pc.inputs, params, 1, "k")
    q = torch.randn(3 * s_q, h_q, d_qk).to(torch.bfloat16)
    kw = dict(attn_sink=torch.randn(h_q), num_partitions=1 + (h_q + s_q + ps) % 4)
    if mode == "sparse":
        kw.update(
            indices=torch.randint(-1, 700, (3 * s_q, 160), dtype=torch.int32),
            topk_lengths=torch.tensor([160, 100, 0], dtype=torch.int32),
        )
    offs = ragged_offsets(q_lens)
    return offline.capture(
        M,
        lambda: M.mla_decode_triton(q, kv, offs, **kw),
        _use_sm90_path=M._sm90_serves,
        mla_combine_triton=lambda *a, **k: None,
    )


def main(modes: list[str], full: bool) -> None:
    seen, kernels, errors, cases = set(), {}, [], 0
    for mode in modes:
        for fmt, (_, dims) in FORMATS.items():
            for d_qk in dims:
                for h_q in (1, 16, 20, 64, 128):
                    for s_q in (1, 2, 4):
                        for ps in (1, 16, 64, 128):
                            case = f"{mode}-{fmt}-{d_qk} h_q {h_q} s_q {s_q} page {ps}"
                            cases += 1
                            for launch in grid_launches(mode, fmt, d_qk, h_q, s_q, ps):
                                src, opts = offline.specialize(launch)
                                key = (launch.name, src.hash(), json.dumps(opts, default=str))
                                if key in seen:
                                    continue
                                seen.add(key)
                                kernels[launch.name] = kernels.get(launch.name, 0) + 1
                                try:
                                    (offline.compile_sm90 if full else offline.front_end)(launch)
                                except Exception as e:  # noqa: BLE001 - collected, reported
                                    cause = e
                                    while cause.__cause__ is not None:
                                        cause = cause.__cause__
                                    errors.append(dict(
                                        case=case, kernel=launch.name,
                                        error="".join(traceback.format_exception_only(e))[-1500:],
                                        cause=str(cause)[-500:],
                                    ))  # fmt: skip
    print(json.dumps(dict(cases=cases, kernels=kernels, errors=errors)))


if __name__ == "__main__":
    args = sys.argv[1:]
    main([m for m in ("dense", "sparse") if m in args] or ["dense", "sparse"], "--full" in args)
