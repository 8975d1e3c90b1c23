"""The host time an eager decode step spends per decoder layer, on the CPU: a Llama-shaped toy
(dims of a few elements, so the CPU's math is negligible) with `--layers` layers and with one
layer, each behind an `LLMEngine(enforce_eager=True)`; the same decode step's model call
(`ModelRunner.eager`) timed on both, and (t(L) - t(1)) / (L - 1) reported as us per layer.
`engine.step()` (scheduling, inputs, sampling, outputs too) is timed beside it.

  python dev/host_eager_cpu.py [--layers 16] [--batch 64] [--calls 50] [--profile] [--triton]
                               [--stub grid|launch] [--full]

--triton: the CUDA path's host code as far as a CPU runs it: TRITON_INTERPRET=1 and the
"triton" backend (`ops.dispatch`), every kernel's interpreted run replaced by a no-op
(`triton.runtime.interpreter.GridExecutor.__call__`), so the ops' checks, planning, prepared
calls and launch binding run, the kernels do not (outputs are garbage; the step is not
sampled). What it leaves out of the GPU host path: the compiled launcher (a prepared launch
hands pointers to Triton's C launcher; the interpreter binds every launch), cuBLAS / torch's
CUDA dispatch of the linears, and torch.empty on CUDA.
--stub launch (with --triton): every interpreted launch (`kernel[grid](...)`) a no-op instead,
so the interpreter's argument binding is left out too (the ops' own host code is timed).
--full (with --triton): the small ops' prepared calls off (`ops.prepared.PreparedOp`: every
rms_norm / rope_store_kv / silu_mul call takes its full path, as before 2026-11-30).
--profile: cProfile of the L-layer model calls, the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

if "--triton" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import bench_model as bm  # noqa: E402
from devtools import best_us_per_call  # noqa: E402

from pagedattn.engine import LLMEngine, SamplingParams  # noqa: E402


def make_engine(layers: int, b: int) -> LLMEngine:
    cfg = dict(bm.hf_config_dict("llama3-8b", dry=True), num_hidden_layers=layers,
               vocab_size=256, hidden_size=16, intermediate_size=16, num_attention_heads=2,
               num_key_value_heads=1, head_dim=8)  # fmt: skip
    model = bm.build_model(cfg, "cpu", torch.float32, 0)
    eng = LLMEngine(model, page_size=16, num_pages=b * 40 + 8, max_num_seqs=b,
                    max_num_batched_tokens=16384, max_model_len=600, enforce_eager=True,
                    async_scheduling=False)  # fmt: skip
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    for _ in range(b):
        eng.add_request({"prompt_token_ids": torch.randint(0, 256, (100,), generator=g).tolist()},
                        params)  # fmt: skip
    for _ in range(4):  # the prefill, then decode steps
        eng.step()
    return eng


def decode_inputs(eng: LLMEngine):
    """The inputs of the engine's next (decode) step, recorded as the runner gets them."""
    got = []
    execute = eng.runner.execute
    eng.runner.execute = lambda inputs: got.append(inputs) or execute(inputs)
    try:
        eng.step()
    finally:
        del eng.runner.execute
    return got[-1]


def stub_kernels(kind: str = "grid") -> None:
    """Every interpreted kernel run a no-op (the host code around it still runs); "launch":
    the whole interpreted launch (Triton's binding of its arguments too)."""
    from triton.runtime import interpreter

    if kind == "launch":
        interpreter.InterpretedFunction.run = lambda self, *args, **kwargs: None
    else:
        interpreter.GridExecutor.__call__ = lambda self, *args, **kwargs: None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--triton", action="store_true", help="the Triton backend's host path")
    ap.add_argument("--stub", choices=("grid", "launch"), default="grid")
    ap.add_argument("--full", action="store_true", help="the small ops' prepared calls off")
    a = ap.parse_args()
    torch.set_num_threads(1)
    engines = {n: make_engine(n, a.batch) for n in (1, a.layers)}
    inputs = {n: decode_inputs(e) for n, e in engines.items()}
    if a.triton:
        os.environ["PAGEDATTN_BACKEND"] = "triton"
        stub_kernels(a.stub)
        if a.full:
            from pagedattn.ops import prepared

            prepared.PreparedOp.prepare = lambda self, key, src, guarded, run, *rest: run()
    model_us = {n: best_us_per_call(lambda e=e, i=inputs[n]: e.runner.eager(i), a.calls)
                for n, e in engines.items()}  # fmt: skip
    per_layer = (model_us[a.layers] - model_us[1]) / (a.layers - 1)
    mode = (
        f"triton (interpreter, {a.stub} stubbed{', full' if a.full else ''})"
        if a.triton
        else "reference"
    )
    print(
        f"{mode}, batch {a.batch}: model call {model_us[1]:.0f} us (1 layer), "
        f"{model_us[a.layers]:.0f} us ({a.layers} layers): {per_layer:.1f} us per layer"
    )
    if not a.triton:
        step_us = {n: best_us_per_call(e.step, a.calls // 5 or 1, 3) for n, e in engines.items()}
        print(f"engine.step(): {step_us[1]:.0f} us (1 layer), {step_us[a.layers]:.0f} us "
              f"({a.layers} layers)")  # fmt: skip
    if a.profile:
        e, i = engines[a.layers], inputs[a.layers]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.calls):
            e.runner.eager(i)
        pr.disable()
        print(f"(cProfile of {a.calls} model calls; divide by {a.calls * a.layers} for a layer)")
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
