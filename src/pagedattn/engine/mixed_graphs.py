"""CUDA graphs for the other steps: `MixedGraphRunner` replays a step with prefill chunks (a
mixed step of decodes and chunks, or chunks alone) as captured pieces, each layer's attention
run eagerly between them (vLLM's piecewise graphs).

Why: such a step was one eager model call, which pays every op's host path each layer (the
prepared calls, torch's linears and modules). A Llama-3.2-1B step of 2,048 tokens took ~9.9
ms of host against ~8.3 ms of device work on the H200 (dev/profile_serve_steps.py, docs/
engine.md); bench-serve's steps are mostly such steps. A replay is L + 1 graph launches and L
prepared `mha` calls.

Buckets: token counts `mixed_buckets(max_tokens)`. A step of T tokens replays the pieces of the
smallest bucket Tb >= T; its tokens [T, Tb) are pad tokens.

Static buffers (`MixedBuffers`, sized for the largest bucket and M + 1 requests, M the decode
graphs' largest batch):
- input_ids / positions [Tmax] int64: the step's tokens, then 0;
- kv inputs of M + 1 rows (`cuda_graphs.DecodeBuffers`' fields): the step's n requests, then
  pad rows (the pad request's cache length and lookup row: no token), and row M, which owns the
  pad tokens: cache length 0 and a lookup row of the pad page in every column, so pad token i
  sits at position i on the pad page (which only pad rows read, cuda_graphs.py);
- q_row_offsets [M + 2] int32: the step's n + 1, then T up to row M, then Tb;
- logits_rows [M] int64: the step's rows to sample, then 0; the logits [M, vocab] float32
  (the decode graphs' output, shared: steps run one at a time).

Pieces: a bucket is captured once on its views of the buffers, through the model's attention
hook (`DecoderForCausalLM.forward(attention_hook=)`): each layer's attention call copies the
layer's q into the static q (the piece's last kernel), ends the piece being captured, records
(the layer, its mask, scale and sinks) and begins the next piece; it returns the static
attention output, which the next piece reads. The static q and output, [max_tokens, h_q, d],
are shared by every layer and bucket (keeping each layer's q for every bucket would hold
layers x the buckets' tokens: 1.4 GB for Llama-3-8B at 2,048 tokens a step). Piece 0 is the
embedding, the RoPE tables and layer 0 up to its attention; piece i (0 < i < L) layer i - 1's
o_proj and MLP and layer i up to its attention; piece L the last layer's rest, the final norm
and the lm_head over the M logits rows.

Replay (`run`): the step's arrays into the buffers (device copies, no host sync); then piece
i, and layer i's attention (`model.attend_piece`, what the eager path calls: `models.layers.
attend_cached` for the Llama family, `DeepseekMLA.attend` for DeepSeek) on the step's own
inputs (`model.piece_context`: its kv inputs, q_row_offsets, num_decodes and `StepPlan`;
DeepSeek's `MLAStepPlan`, which reads the step's query counts on the host as its eager step
does), the first T rows of the static q, into the first T rows of the static output; after the
last layer, piece L.
Pad tokens stay in their own rows (row-wise ops; the KV store writes them to the pad page;
attention never reads them), and the logits of rows past the step's are not returned.

Models: `supports_piecewise_graphs` (the Llama family, its MoE variants, gpt-oss and DeepSeek
where their decode steps are captured: an MLP or experts without host syncs at any token
count; DeepSeek's pieces end after each layer's latent rows are stored, its hook's q is [q_nope
| q_pe] and its output [T, h, v_head_dim], the hook's `out_dim`); one device (tensor
parallelism keeps these steps eager).

`emulate=True` (tests, any device): a replay runs the model eagerly on the static buffers with
a hook that runs the attention as a replay does (rows past T of its output NaN-poisoned), so
the buffers and the padding run on the CPU.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable

import torch

from ..errors import check, check_bool, check_int
from ..ops.mha import StepPlan
from .cuda_graphs import (
    DecodeBuffers,
    GraphRunner,
    takes_attention_plan,
    takes_logits_out,
    takes_num_decodes,
)
from .step_inputs import StepInputs


def mixed_buckets(max_tokens: int) -> tuple[int, ...]:
    """The captured token counts for steps of up to `max_tokens` tokens (an int >= 1): 16, 64,
    256, 512, then every 512 below max_tokens, then max_tokens itself. A step pads at most to
    its bucket: a quarter more compute for its linears above 512 tokens, where a 2,048-token
    step of the 1B spends ~6 of its ~8 ms."""
    max_tokens = check_int("max_tokens", max_tokens, 1)
    sizes = [t for t in (16, 64, 256, 512) if t < max_tokens]
    sizes += range(1024, max_tokens, 512)
    return (*sizes, max_tokens)


def supports_piecewise_graphs(model: torch.nn.Module) -> bool:
    """Whether the engine may capture `model`'s mixed steps in pieces: it says so, and it takes
    an attention hook."""
    return getattr(model, "supports_piecewise_graphs", False) is True


class MixedBuffers(DecodeBuffers):
    """The static inputs of every mixed-step bucket (module docstring): the kv inputs of M + 1
    rows, tokens for `max_tokens`, the logits shared with `decode` (the decode graphs')."""

    def __init__(self, decode: DecodeBuffers, pad_page: int, max_tokens: int) -> None:
        M = decode.max_batch
        pad = dataclasses.replace(decode.kv_rows(1), cache_lengths=decode.pad_cache_length[None],
                                  lookup_table=decode.pad_lookup_row[None])  # fmt: skip
        super().__init__(pad, M + 1, decode.logits.shape[1], decode.logits)
        dev = decode.logits.device
        T = self.max_tokens = check_int("max_tokens", max_tokens, 1)
        self.input_ids = torch.zeros(T, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(T, dtype=torch.int64, device=dev)
        self.q_row_offsets = torch.zeros(M + 2, dtype=torch.int32, device=dev)
        self.logits_rows = torch.zeros(M, dtype=torch.int64, device=dev)
        self.max_requests = M
        # row M owns the pad tokens: cache length 0, the pad page in every column
        self.kv.cache_lengths[M] = 0
        self.kv.lookup_table[M] = pad_page
        self.reach = self.kv.lookup_table.shape[1] * self.kv.kv_blocks.shape[3]
        self._dirty_tokens = 0
        self._dirty_logits = 0

    def load(self, inputs: StepInputs, bucket: int) -> None:
        """Copy a step of n <= M requests, T <= bucket tokens and R <= M sampled rows into the
        buffers, the rest padding (module docstring). Device copies only (no host sync)."""
        n, T, R = inputs.batch_size, inputs.num_tokens, len(inputs.sample_index)
        M = self.max_requests
        if not (1 <= n <= M and 1 <= T <= bucket <= self.max_tokens and R <= M):
            check(False, "inputs", f"a step of 1 to {M} requests and 1 to {bucket} tokens",
                  f"{n} requests, {T} tokens, {R} rows")  # fmt: skip
        self.load_kv(inputs, n)
        self.input_ids[:T].copy_(inputs.input_ids)
        self.positions[:T].copy_(inputs.positions)
        if self._dirty_tokens > T:
            self.input_ids[T : self._dirty_tokens].zero_()
            self.positions[T : self._dirty_tokens].zero_()
        self._dirty_tokens = T
        offs = self.q_row_offsets
        offs[: n + 1].copy_(inputs.q_row_offsets)
        offs[n + 1 : M + 1].fill_(T)
        offs[M + 1 :].fill_(bucket)
        self.logits_rows[:R].copy_(inputs.logits_rows)
        if self._dirty_logits > R:
            self.logits_rows[R : self._dirty_logits].zero_()
        self._dirty_logits = R


class _Bucket:
    """One bucket's capture: its pieces (CUDA graphs) and each layer's attention call (layer,
    the hook's keyword arguments: mask, scale, sinks; DeepSeek's out_dim)."""

    __slots__ = ("pieces", "calls")

    def __init__(self) -> None:
        self.pieces: list = []
        self.calls: list[tuple] = []


class MixedGraphRunner:
    """Mixed and prefill steps through captured pieces (module docstring).

    model: a model with `supports_piecewise_graphs`, bound to the cache of `decode`'s manager.
    decode: the engine's `GraphRunner` (its pad page, its buffers' pad rows and logits).
    max_tokens: the largest step (the engine's max_num_batched_tokens).
    emulate: replays run the model eagerly on the static buffers (tests; any device)."""

    @torch.inference_mode()
    def __init__(
        self, model: torch.nn.Module, decode: GraphRunner, max_tokens: int, *, emulate: bool
    ) -> None:
        check(supports_piecewise_graphs(model), "model", "a model with piecewise graphs",
              type(model).__name__)  # fmt: skip
        self.model = model
        self.emulate = check_bool("emulate", emulate)
        self.buckets = mixed_buckets(max_tokens)
        self.buffers = MixedBuffers(decode.buffers, decode.pad_page, self.buckets[-1])
        self._hint = takes_num_decodes(model)
        self._plan = takes_attention_plan(model)
        self._logits_out = takes_logits_out(model)
        self.num_replays = 0
        self.captured: dict[int, _Bucket] = {}
        # the layers' q and the attention's output, [max_tokens, h_q, d], shared by every layer
        # and bucket (`_statics`)
        self._q: torch.Tensor | None = None
        self._o: torch.Tensor | None = None
        if self.emulate:
            return
        with torch.cuda.device(self.buffers.logits.device):
            pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            for tb in reversed(self.buckets):  # largest first: the others reuse its memory
                try:
                    self.captured[tb] = self._capture(tb, pool, stream)
                except Exception as e:
                    if hasattr(e, "add_note"):  # Python >= 3.11
                        e.add_note(f"capturing mixed-step pieces of {tb} tokens; "
                                   "enforce_eager=True skips graphs")  # fmt: skip
                    raise

    def _call(self, tb: int, hook: Callable) -> None:
        """The model on bucket tb's views of the buffers, with `hook` as its attention."""
        s = self.buffers
        kw: dict = {"num_decodes": 0} if self._hint else {}
        if self._logits_out:
            kw["logits_out"] = s.logits
        y = self.model(s.input_ids[:tb], s.positions[:tb], s.kv, s.q_row_offsets,
                       s.logits_rows, attention_hook=hook, **kw)  # fmt: skip
        if y is not s.logits:
            s.logits.copy_(y)

    def _statics(self, q: torch.Tensor, out_dim: int | None = None) -> tuple[torch.Tensor, ...]:
        """The first q.shape[0] rows of the static q (into which each piece ends by copying its
        layer's q: one buffer, not a q kept for every layer of every bucket) and of the static
        attention output (q's shape, or out_dim last: DeepSeek's MLA); allocated at the first
        call (a warm-up, outside any capture)."""
        if self._q is None:
            shape = (self.buffers.max_tokens, *q.shape[1:])
            self._q = torch.empty(shape, dtype=q.dtype, device=q.device)
            shape = (*shape[:-1], shape[-1] if out_dim is None else out_dim)
            self._o = torch.empty(shape, dtype=q.dtype, device=q.device)
        return self._q[: q.shape[0]], self._o[: q.shape[0]]

    def _capture(self, tb: int, pool, stream: torch.cuda.Stream) -> _Bucket:
        """Warm bucket tb up once on `stream` (kernels compile, cuBLAS initializes; the static
        q and output are allocated), then capture its pieces into `pool`."""
        b = _Bucket()

        def warm(q, layer_idx, **call):
            qs, o = self._statics(q, call.get("out_dim"))
            qs.copy_(q)
            return o

        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._call(tb, warm)
        torch.cuda.synchronize()
        graph = [torch.cuda.CUDAGraph()]

        def cut(q, layer_idx, **call):
            qs, o = self._statics(q, call.get("out_dim"))
            qs.copy_(q)  # (the piece's last kernel)
            graph[0].capture_end()
            b.pieces.append(graph[0])
            b.calls.append((layer_idx, call))
            graph[0] = torch.cuda.CUDAGraph()
            graph[0].capture_begin(pool=pool)
            return o

        with torch.cuda.stream(stream):
            graph[0].capture_begin(pool=pool)
            try:
                self._call(tb, cut)
            finally:
                graph[0].capture_end()
            b.pieces.append(graph[0])
        torch.cuda.synchronize()
        return b

    def bucket(self, T: int) -> int:
        """The captured token count that serves a step of T tokens (T <= the largest)."""
        return self.buckets[bisect.bisect_left(self.buckets, T)]

    def serves(self, inputs: StepInputs) -> bool:
        """Whether the pieces replay `inputs`: 1 to M requests and max_tokens tokens on one
        device, at most M rows sampled, its pad tokens within the pad row's reach, and a step
        the model runs in pieces (`model.serves_in_pieces` of its host query offsets)."""
        T, s = inputs.num_tokens, self.buffers
        return (
            1 <= inputs.batch_size <= s.max_requests
            and 1 <= T <= self.buckets[-1]
            and len(inputs.sample_index) <= s.max_requests
            and len(inputs.kv_inputs) == 1
            and self.bucket(T) - T <= s.reach
            and self.model.serves_in_pieces(inputs.host.q_row_offsets)
        )

    def _context(self, inputs: StepInputs):
        """The step's own attention context (`model.piece_context`: the eager path's `mha`
        arguments; DeepSeek's, its MLA plan of the step)."""
        plan = StepPlan(inputs.host.cache_lengths) if self._plan else None
        nd = inputs.num_decodes if self._hint else None
        return self.model.piece_context(inputs.kv_inputs[0], inputs.q_row_offsets, nd, plan)

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [R, vocab] float32 of a step that `serves` accepts (R its sampled rows): a
        view of the static output, valid until the next step."""
        check(self.serves(inputs), "inputs", "a step the mixed graphs serve", inputs.num_tokens)
        T, R = inputs.num_tokens, len(inputs.sample_index)
        tb = self.bucket(T)
        s = self.buffers
        s.load(inputs, tb)
        ctx = self._context(inputs)
        if self.emulate:

            def attend(q, layer_idx, **call):
                qs, o = self._statics(q, call.get("out_dim"))
                qs.copy_(q)
                o.fill_(float("nan"))  # (rows past T: never written)
                self.model.attend_piece(qs[:T], layer_idx, ctx, out=o[:T], **call)
                return o

            self._call(tb, attend)
        else:
            b = self.captured[tb]
            q, o = self._q[:T], self._o[:T]
            for piece, (layer_idx, call) in zip(b.pieces, b.calls):
                piece.replay()
                self.model.attend_piece(q, layer_idx, ctx, out=o, **call)
            b.pieces[-1].replay()
        self.num_replays += 1
        return s.logits[:R]


__all__ = ["MixedBuffers", "MixedGraphRunner", "mixed_buckets", "supports_piecewise_graphs"]
