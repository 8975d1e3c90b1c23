"""CUDA graphs for decode steps: `GraphRunner` replays one captured graph per batch-size bucket.

A pure decode step (every request runs 1 new token and samples from it) of n requests replays
the graph of the smallest bucket B >= n (`decode_buckets`: 1, 2, 4, 8, then every 16, up to the
largest decode batch). Every other step (a prefill chunk in it) runs eagerly (`ModelRunner`).

Static buffers (`DecodeBuffers`), one set for the largest bucket M, which every graph reads
through views of its first B rows:
- input_ids [M] int64, positions [M] int64, q_row_offsets [M + 1] int32 = arange (one query a
  row), logits_rows [M] int64 = arange, logits [M, vocab] float32 (the graph's output);
- kv: a `KVCacheInputsPerDevice` over the real cache (kv_blocks / kv_scales shared) with
  cache_lengths [M] int32 and lookup_table [M, max_pages_per_request] int32 (`padded_cols`
  fixed to the pages of max_seq_len), plus the step's max_lengths / dispatch metadata.

The engine stages a decode step straight into them (`StepStaging`): it packs the step's host
arrays (the manager's `host_runtime_inputs`, the tokens and positions) into one int64 buffer
of fixed address with one host-to-device copy, and each graph's first kernel
(`ops.step_rows.unpack_step_rows`) writes rows [0, B) of the static buffers from it (rows
[n, B) pad rows, lookup columns past the step's width the sentinel). The deferred tokens (a
decode whose input is the previous step's sample) are written into input_ids on the device
before the replay (`InFlightStep.feed`), and the unpack leaves those rows alone. Outside the
graph a decode step then runs that copy, the feed and the replay, where copying its device
arrays into the buffers took six more device copies, each a host call and an idle gap on the
device (H200, Llama-3.2-1B b64: 70-80 us of its 1.6 ms step idle outside the graph,
`dev/profile_engine_step.py`). Steps built otherwise (`run` of `build_step_inputs`' arrays)
are copied in with device copies (`DecodeBuffers.load`, `KVCacheInputsPerDevice.copy_`
sentinel-pads the narrower table) and the unpack told to skip. A replay returns `logits[:n]`:
no host sync, no allocation. Rows [n, B) are pad rows, each a request of one query (token 0 at
position 0) over cache length 0, whose lookup row is [pad page, sentinel, ...]: the pad page is
one page `GraphRunner` claims in the manager for `PAD_REQUEST` and never commits. Pad rows thus
read and write that page only (the same values: same token, same position), and nothing a real
request owns or the prefix cache holds. Why a page and not zero-query pad requests: a token
outside every request's q_row_offsets range is skipped by `store_kv`, but the Triton decode
kernel would look its request up past the batch, and the CPU references reject it; one query a
row also keeps `mha` on its balanced decode work list.

Capture: at construction, largest bucket first, all graphs in one memory pool (a smaller graph
reuses the larger one's blocks, as vLLM does); each is warmed up once (Triton compiles, cuBLAS
initializes) and captured while every row is a pad row, so capture touches the pad page only.
`emulate=True` (tests, any device) builds the same buffers and replays by running the captured
function eagerly instead of a `torch.cuda.CUDAGraph`: the padding and static-buffer logic then
runs on the CPU.

Models: a model says it can be captured with `supports_cuda_graphs` (True for the Llama
family; gpt-oss and DeepSeek where their experts run without a host sync: `ops.moe` in bf16 /
fp16 on CUDA); others stay eager.
"""

from __future__ import annotations

import bisect
import dataclasses
import inspect
from collections.abc import Callable

import numpy as np
import torch

from ..cache.buffers import StagingRing
from ..cache.inputs import FIELD_ORDER, KVCacheInputsPerDevice
from ..cache.manager import PagedKVCacheManager
from ..errors import check, check_bool, check_int
from ..models import parallel
from ..ops.fused import argmax_rows
from ..ops.mha import StepPlan
from ..ops.specialize import int_class_counts
from ..ops.step_rows import KEEP, StagedRows, unpack_step_rows
from .step_inputs import HostStepInputs, StepInputs


def decode_buckets(max_batch: int) -> tuple[int, ...]:
    """The captured batch sizes for decode batches of up to `max_batch` (an int >= 1):
    1, 2, 4, 8, then multiples of 16 below max_batch, then max_batch itself."""
    max_batch = check_int("max_batch", max_batch, 1)
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += range(16, max_batch, 16)
    return (*sizes, max_batch)


def warm_up_widths(graph_cols: int, tokens: int, page_size: int) -> list[int]:
    """The lookup-table widths a warm-up step runs at: the graphs' `graph_cols`, 3 and 1 (a
    multiple of 16 or not, and 1: the classes of the table's row stride, which the MLA kernels
    specialize on), those that a request of `tokens` new tokens on pages of `page_size` fits
    in, ascending."""
    need = -(-tokens // page_size)  # the pages such a request fills
    return sorted({w for w in (graph_cols, 3, 1) if need <= w <= graph_cols})


def warm_up_steps(
    max_batch: int, max_tokens: int, graph_cols: int, page_size: int, chunk: int = 2
) -> tuple[tuple[int, int, int], ...]:
    """The (decodes, chunks of `chunk` tokens, lookup-table width) of `GraphRunner.
    warm_up_eager`'s steps, for decode graphs of up to `max_batch` requests with tables
    `graph_cols` wide (ints >= 1), steps of at most `max_tokens` tokens (an int >= chunk),
    pages of `page_size` and chunks of `chunk` tokens (an int >= 2; the model's
    `warm_up_chunk_lengths`).

    Request counts: `ops.specialize.int_class_counts` (every class of a count a kernel
    specializes on), as n chunks, then as n decodes and one chunk (at most max_batch
    requests). Widths: `warm_up_widths` of a chunk (2 at least for 2 tokens on pages of 1
    row)."""
    max_batch = check_int("max_batch", max_batch, 1)
    chunk = check_int("chunk", chunk, 2)
    max_tokens = check_int("max_tokens", max_tokens, chunk)
    graph_cols = check_int("graph_cols", graph_cols, 1)
    widths = warm_up_widths(graph_cols, chunk, check_int("page_size", page_size, 1))
    counts = int_class_counts(max_batch)
    chunks = sorted({min(n, max_tokens // chunk) for n in counts})
    decodes = sorted({min(d, max_batch - 1, max_tokens - chunk) for d in counts} - {0})
    return tuple(
        [(0, n, w) for n in chunks for w in widths] + [(d, 1, w) for d in decodes for w in widths]
    )


def aligned_row_steps(max_batch: int, max_tokens: int, max_q: int) -> tuple[tuple[int, ...], ...]:
    """Query lengths of `GraphRunner.warm_up_eager`'s steps whose query-row count is a multiple
    of 16, for a model that attends requests of at most `max_q` queries together in one
    kernel (`warm_up_absorbed_max_q`: DeepSeek's absorbed MLA, which specializes on the row
    count, Triton's class of the int, and on the request count): one step for each request
    count r of `ops.specialize.int_class_counts(max_batch)` (r >= 2), of 16 * ceil((r + 1) /
    16) rows where they fit in r * max_q and `max_tokens`: decodes of 1 query first, then the
    chunks of up to max_q (the engine's order). The other row classes come from
    `warm_up_steps`' steps."""
    max_batch = check_int("max_batch", max_batch, 1)
    max_tokens = check_int("max_tokens", max_tokens, 1)
    max_q = check_int("max_q", max_q, 2)
    steps = []
    for r in int_class_counts(max_batch):
        rows = 16 * -(-(r + 1) // 16)
        if r < 2 or rows > min(r * max_q, max_tokens):
            continue
        q_lens = [1] * r
        extra, i = rows - r, r - 1
        while extra:  # fill the last requests up to max_q queries each
            add = min(extra, max_q - 1)
            q_lens[i] += add
            extra -= add
            i -= 1
        steps.append(tuple(q_lens))
    return tuple(steps)


def takes_num_decodes(model: torch.nn.Module) -> bool:
    """Whether the model's step forward takes the `num_decodes` hint (`StepInputs`)."""
    return "num_decodes" in inspect.signature(model.forward).parameters


def takes_logits_out(model: torch.nn.Module) -> bool:
    """Whether the model's step forward writes its logits into a given `logits_out`."""
    return "logits_out" in inspect.signature(model.forward).parameters


def takes_attention_plan(model: torch.nn.Module) -> bool:
    """Whether the model's step forward takes the step's `attention_plan` (a `StepPlan`)."""
    return "attention_plan" in inspect.signature(model.forward).parameters


def supports_cuda_graphs(model: torch.nn.Module) -> bool:
    """Whether `model`'s step can be captured: it says so (`supports_cuda_graphs`, a class
    attribute or, where it depends on the device and dtype, a property)."""
    return getattr(model, "supports_cuda_graphs", False) is True


def graph_mode(
    model: torch.nn.Module,
    device: torch.device,
    *,
    enforce_eager: bool,
    tp_size: int,
    emulate: bool = False,
) -> str | None:
    """How decode steps run: "cuda" (captured graphs), "emulated" (tests: the graph path run
    eagerly) or None (eager). Eager with `enforce_eager` or a model that cannot be captured;
    graphs need CUDA. With tensor parallelism (tp_size > 1) the graphs capture the model's
    NCCL all-reduces (another backend, e.g. gloo on GPU tensors, stays eager): every rank
    captures the same buckets in the same order (collectives matched), after a warm-up call
    that has created the communicator."""
    enforce_eager = check_bool("enforce_eager", enforce_eager)
    check_int("tp_size", tp_size, 1)
    if enforce_eager or not supports_cuda_graphs(model):
        return None
    if emulate:
        return "emulated"
    if torch.device(device).type != "cuda":
        return None
    if tp_size > 1 and parallel.backend() != "nccl":  # gloo's collectives cannot be captured
        return None
    return "cuda"


class _PadRequest:
    """The manager's id of the request that owns the pad page (one object per process)."""

    def __repr__(self) -> str:
        return "PAD_REQUEST"


PAD_REQUEST = _PadRequest()


class DecodeBuffers:
    """The static inputs and output of every decode graph, sized for the largest bucket
    (module docstring). Rows [0, n) hold the last loaded step, rows [n, max_batch) pad rows."""

    BATCH_FIELDS = ("cache_lengths", "lookup_table")  # the kv fields with a batch dimension
    META_FIELDS = ("attention_dispatch_metadata", "draft_attention_dispatch_metadata")

    def __init__(self, pad: KVCacheInputsPerDevice, max_batch: int, vocab_size: int,
                 logits: torch.Tensor | None = None) -> None:  # fmt: skip
        """pad: the pad request's inputs (`runtime_inputs([PAD_REQUEST], padded_cols=...)`,
        batch 1), the template of every pad row. logits: the float32 [max_batch, vocab_size]
        output to share (another set's, `mixed_graphs.MixedBuffers`), or None (a new one)."""
        M = self.max_batch = check_int("max_batch", max_batch, 1)
        dev = pad.cache_lengths.device
        self.input_ids = torch.zeros(M, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(M, dtype=torch.int64, device=dev)
        self.q_row_offsets = torch.arange(M + 1, dtype=torch.int32, device=dev)
        self.logits_rows = torch.arange(M, dtype=torch.int64, device=dev)
        self.tokens = torch.zeros(M, dtype=torch.int64, device=dev)  # a decode graph's argmax
        if logits is None:
            logits = torch.zeros(M, vocab_size, dtype=torch.float32, device=dev)
        self.logits = logits
        self.pad_cache_length = pad.cache_lengths[0].clone()
        self.pad_lookup_row = pad.lookup_table[0].clone()
        # the device metadata fields, views of one int64 tensor (`StepStaging` writes it whole)
        self.meta_fields = [n for n in self.META_FIELDS if getattr(pad, n) is not None]
        metas = [getattr(pad, n).reshape(-1).to(torch.int64) for n in self.meta_fields]
        self.meta = torch.cat(metas) if metas else None
        fields, at = {}, 0
        for name in FIELD_ORDER:
            v = getattr(pad, name)
            if name in self.BATCH_FIELDS:  # every row a pad row
                fields[name] = v.expand(M, *v.shape[1:]).contiguous()
            elif name in ("kv_blocks", "kv_scales") or v is None:
                fields[name] = v  # the cache itself (shared)
            elif name in self.meta_fields:
                fields[name] = self.meta[at : at + v.numel()].view(v.shape)
                at += v.numel()
            else:
                fields[name] = v.clone()
        self.kv = KVCacheInputsPerDevice(**fields)
        self._kv_rows: dict[int, KVCacheInputsPerDevice] = {}  # `load`'s kv_rows(n)
        self._dirty = 0  # rows [0, _dirty) may hold a real step's values

    def kv_rows(self, n: int) -> KVCacheInputsPerDevice:
        """A view of rows [0, n) of the static kv inputs (the other fields as they are)."""
        rows = self._kv_rows.get(n)
        if rows is None:  # (the views of rows [0, n) are the same every step: made once)
            rows = self._kv_rows[n] = self._kv_view(n)
        return rows

    def _kv_view(self, n: int) -> KVCacheInputsPerDevice:
        kv = self.kv
        return KVCacheInputsPerDevice(
            **{
                name: getattr(kv, name)[:n] if name in self.BATCH_FIELDS else getattr(kv, name)
                for name in FIELD_ORDER
            }
        )

    def load(self, inputs: StepInputs) -> None:
        """Copy a decode step of n <= max_batch requests into rows [0, n) and make rows
        [n, max_batch) pad rows again. Device-to-device copies only (no host sync)."""
        n = inputs.batch_size
        if not (1 <= n <= self.max_batch and inputs.num_tokens == n):
            check(
                False,
                "inputs",
                f"a decode step of 1 to {self.max_batch} requests, one token each",
                f"{n} requests, {inputs.num_tokens} tokens",
            )
        dirty = self._dirty
        self.load_kv(inputs, n)
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        if dirty > n:
            self.input_ids[n:dirty].zero_()
            self.positions[n:dirty].zero_()

    def load_kv(self, inputs: StepInputs, n: int) -> None:
        """The step's kv inputs (n requests) into rows [0, n) of the static ones, and rows
        [n, the last load's n) pad rows again. Device copies only."""
        self.kv_rows(n).copy_(inputs.kv_inputs[0])  # checks every field first
        if self._dirty > n:
            pad = slice(n, self._dirty)
            self.kv.cache_lengths[pad].copy_(self.pad_cache_length)
            self.kv.lookup_table[pad].copy_(self.pad_lookup_row)
        self._dirty = n


class StepStaging:
    """A decode step's host arrays staged straight into `buffers` (module docstring): one
    int64 buffer of fixed address (`StagedRows` layout, sized for the largest bucket and the
    static table's width), written by one non-blocking host-to-device copy a step through a
    `StagingRing` (CUDA; elsewhere a plain copy), and `unpack(b)`, the captured graphs' first
    kernel. The buffer starts with n = -1 (unpack nothing)."""

    def __init__(self, buffers: DecodeBuffers) -> None:
        s = self.buffers = buffers
        dev = s.input_ids.device
        meta = 0 if s.meta is None else s.meta.numel()
        self.layout = StagedRows(s.max_batch, s.kv.lookup_table.shape[1], meta)
        self.stage = torch.zeros(self.layout.size, dtype=torch.int64, device=dev)
        self.stage[0] = -1
        self.sentinel = int(s.kv.kv_blocks.shape[0])  # the lookup table's unused entry
        self._ring = StagingRing(dev) if dev.type == "cuda" else None
        self._host_fields = [n for n in ("max_lengths", "mla_num_partitions",
                                         "draft_mla_num_partitions")
                             if getattr(s.kv, n) is not None]  # fmt: skip

    def unpack(self, rows: int) -> None:
        """Rows [0, rows) of the buffers from the staged step (a graph's first kernel)."""
        s = self.buffers
        kv = s.kv
        unpack_step_rows(self.stage, self.layout, rows, kv.cache_lengths, kv.lookup_table,
                         s.input_ids, s.positions, s.tokens, s.meta, s.pad_cache_length,
                         s.pad_lookup_row, self.sentinel)  # fmt: skip

    def skip(self) -> None:
        """Make the next unpack write nothing (a step loaded with device copies instead)."""
        self.stage[:1].fill_(-1)

    def write(
        self, kv_host: dict, host: HostStepInputs, deferred: np.ndarray, gather: bool
    ) -> torch.Tensor | None:
        """Stage a decode step of n rows: `kv_host` (`host_runtime_inputs` of its requests),
        its tokens and positions (`host`; a deferred token's id is negative), and `deferred`
        [d, 2] int64 (batch index, source row). gather: the sources are rows of the buffers'
        `tokens` (the previous step was a replay that took its argmax there): the unpack
        writes them, and None is returned. Otherwise the deferred rows keep their ids (`KEEP`)
        and the pairs are returned on the device, [2 d] int64 (the d rows, then their d
        sources: `StepInputs.deferred`, for the feed), a view of the staging buffer valid until
        the next write."""
        L, M = self.layout, self.layout.max_rows
        lut = kv_host["lookup_table"]
        n, w = lut.shape
        ids = np.where(host.input_ids < 0, KEEP, host.input_ids)
        if gather and len(deferred):
            ids[deferred[:, 0]] = -1 - deferred[:, 1]
            deferred = deferred[:0]
        d = len(deferred)
        metas = [kv_host[name].reshape(-1) for name in self.buffers.meta_fields]
        words = L.words(n, w)

        def fill(host_bytes: np.ndarray) -> None:
            h = host_bytes[: words * 8].view(np.int64)
            h[0], h[1] = n, w
            at = L.rows_at
            h[at : at + n] = kv_host["cache_lengths"]
            h[at + M : at + M + n] = ids
            h[at + 2 * M : at + 2 * M + n] = host.positions
            if metas:
                h[L.meta_at : L.meta_at + L.meta] = np.concatenate(metas)
            if d:
                h[L.deferred_at : L.deferred_at + 2 * d] = deferred.T.reshape(-1)
            h[L.lut_at : words] = lut.reshape(-1)

        if self._ring is not None:
            self._ring.copy_into(self.stage, words * 8, fill)
        else:
            tmp = np.empty(words * 8, np.uint8)
            fill(tmp)
            self.stage[:words].copy_(torch.from_numpy(tmp.view(np.int64)))
        for name in self._host_fields:  # host tensors: read on the host, never by a graph
            getattr(self.buffers.kv, name).numpy()[...] = kv_host[name]
        return self.stage[L.deferred_at : L.deferred_at + 2 * d] if d else None


class _EmulatedGraph:
    """Stands in for `torch.cuda.CUDAGraph` (emulate=True): replay() runs the function."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def replay(self) -> None:
        self.fn()


def _capture(fn: Callable[[], None], pool, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """Warm `fn` up once on `stream` (Triton compiles, cuBLAS initializes, and the stream's
    counters of the balanced decode's fused merge are made, `ops.prepared.semaphores`, all
    outside the capture), then capture it on `stream` into a graph that allocates from
    `pool`."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph


class GraphRunner:
    """Decode steps through captured graphs (module docstring).

    model: a capturable model (`supports_cuda_graphs`) with the step forward of
      `models.DecoderForCausalLM`, bound to `manager`'s cache.
    manager: the engine's `PagedKVCacheManager` (one device); it must have a free batch slot
      and a free page for `PAD_REQUEST`, which this claims for good.
    max_batch: the largest decode batch (an int >= 1); buckets `decode_buckets(max_batch)`.
    emulate: run the captured function eagerly instead of CUDA graphs (tests; any device).
    """

    @torch.inference_mode()
    def __init__(
        self,
        model: torch.nn.Module,
        manager: PagedKVCacheManager,
        max_batch: int,
        *,
        emulate: bool = False,
    ) -> None:
        self.model = model
        self._takes_hint = takes_num_decodes(model)
        self.emulate = check_bool("emulate", emulate)
        self.buckets = decode_buckets(max_batch)
        check(
            len(manager.params.devices) == 1,
            "manager",
            "a cache on one device",
            f"{len(manager.params.devices)} devices",
        )
        manager.claim(PAD_REQUEST, [0])
        manager.alloc(PAD_REQUEST, 1)
        self.pad_page = manager.pages(PAD_REQUEST)[0]
        (pad,) = manager.runtime_inputs([PAD_REQUEST], padded_cols=manager.max_pages_per_request)
        self.buffers = DecodeBuffers(pad, self.buckets[-1], model.config.vocab_size)
        self.staging = StepStaging(self.buffers)
        self.num_replays = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph | _EmulatedGraph] = {}
        if self.emulate:
            for b in self.buckets:
                self.graphs[b] = _EmulatedGraph(self._forward_fn(b))
            return
        with torch.cuda.device(pad.cache_lengths.device):
            pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()  # every bucket's warm-up and capture
            for b in reversed(self.buckets):  # largest first: the others reuse its pool memory
                try:
                    self.graphs[b] = _capture(self._forward_fn(b), pool, stream)
                except Exception as e:
                    if hasattr(e, "add_note"):  # Python >= 3.11
                        e.add_note(f"capturing decode graph {b}; enforce_eager=True skips graphs")
                    raise

    def _forward_fn(self, b: int) -> Callable[[], None]:
        """The step of bucket b on rows [0, b) of the static buffers, logits into them."""
        s = self.buffers
        ids, pos, kv = s.input_ids[:b], s.positions[:b], s.kv_rows(b)
        offs, rows, out = s.q_row_offsets[: b + 1], s.logits_rows[:b], s.logits[:b]
        # every row one query: the models' `num_decodes` hint (DeepSeek plans from it)
        hint = {"num_decodes": b} if self._takes_hint else {}
        if takes_logits_out(self.model):  # the logits converted straight into the output
            hint["logits_out"] = out

        tokens = s.tokens[:b]

        def forward() -> None:
            self.staging.unpack(b)
            y = self.model(ids, pos, kv, offs, rows, **hint)
            if y is not out:
                out.copy_(y)
            tokens.copy_(argmax_rows(out))  # the greedy tokens (`greedy_tokens`)

        return forward

    @torch.inference_mode()
    def warm_up_eager(self, max_tokens: int) -> tuple[tuple[int, int, int], ...]:
        """Run, once, the eager steps whose kernel variants the decode graphs did not compile,
        every request on the pad page, so that they compile at start-up instead of in the
        middle of serving (docs/kernels/jit_specializations.md): prefill steps and mixed
        steps (decodes and a chunk) at every class of request count and table width a kernel
        specializes on (`warm_up_steps`), at most `max_tokens` tokens a step; and, for a model
        that takes the step's `attention_plan`, each count of decodes once more with a work plan
        (`ModelRunner.eager` passes a plan of the step's host lengths, which the decode launch
        uses where it splits into more than one wave, `StepPlan`; the MHA kernels do not
        specialize on the table's width). The chunks hold 2 tokens, and for a model that
        names more lengths (`warm_up_chunk_lengths`: DeepSeek's 9, a chunk its attention
        expands, beside decodes it absorbs) each length's steps run in turn; a model that
        attends short requests together in a kernel specializing on the row count
        (`warm_up_absorbed_max_q`: DeepSeek) also runs `aligned_row_steps` at each width.
        Touches the pad page only. Returns the (decodes, chunks, width) of the
        `warm_up_steps` run without a plan, length after length."""
        s = self.buffers
        steps: tuple = ()
        planned = set() if takes_attention_plan(self.model) else None
        graph_cols, page = s.kv.lookup_table.shape[1], s.kv.kv_blocks.shape[3]
        for c in getattr(self.model, "warm_up_chunk_lengths", (2,)):
            if c > max(max_tokens, 2):  # (steps this small never hold such a chunk)
                continue
            ran = warm_up_steps(self.buckets[-1], max_tokens, graph_cols, page, c)
            for d, n, cols in ran:
                self._pad_step([1] * d + [c] * n, cols)
                if planned is not None and d and d not in planned:
                    planned.add(d)
                    self._pad_step([1] * d + [c] * n, cols, planned=True)
            steps += ran
        max_q = getattr(self.model, "warm_up_absorbed_max_q", None)
        if max_q:  # row counts that are multiples of 16 (`aligned_row_steps`)
            for q_lens in aligned_row_steps(self.buckets[-1], max_tokens, max_q):
                for cols in warm_up_widths(graph_cols, max_q, page):
                    self._pad_step(list(q_lens), cols)
        return steps

    def _pad_step(self, q_lens: list[int], cols: int, planned: bool = False) -> None:
        """One eager model step of requests of `q_lens` new tokens, its leading requests of
        one token the step's decodes (`num_decodes`) and the rest chunks (of >= 2 tokens),
        every one at cache length 0 on the pad page, with a lookup table `cols` wide
        (contiguous); planned: with a work plan made on the device (always used, so its kernel
        variants compile whatever the pad lengths)."""
        s, r = self.buffers, len(q_lens)
        decodes = next((i for i, n in enumerate(q_lens) if n > 1), r)
        dev = s.input_ids.device
        kv = s.kv_rows(r)
        lut = torch.full((r, cols), int(s.pad_lookup_row[-1]), dtype=torch.int32, device=dev)
        lut[:, : -(-max(q_lens) // s.kv.kv_blocks.shape[3])] = self.pad_page  # a chunk's pages
        kv = dataclasses.replace(kv, lookup_table=lut)
        lens = torch.tensor(q_lens, device=dev)
        offs = torch.zeros(r + 1, dtype=torch.int32, device=dev)
        offs[1:] = lens.cumsum(0)
        pos = torch.cat([torch.arange(n, device=dev) for n in q_lens])
        ids = torch.zeros_like(pos)
        rows = (offs[1:] - 1).to(torch.int64)  # each request's last token
        hint = {"num_decodes": decodes} if self._takes_hint else {}
        if planned:
            hint["attention_plan"] = StepPlan()
        self.model(ids, pos, kv, offs, rows, **hint)

    def bucket(self, n: int) -> int:
        """The captured batch size that serves n requests (n <= the largest bucket)."""
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def stages(self, host: HostStepInputs) -> bool:
        """Whether the step of `host` (`host_step_inputs`) is one `stage_step` takes: a pure
        decode step of 1 to max_batch requests, every one sampling."""
        n = len(host.cache_lengths)
        return 1 <= n <= self.buckets[-1] and len(host.input_ids) == n == len(host.sample_index)

    @torch.inference_mode()  # (the static buffers are inference tensors)
    def stage_step(
        self,
        manager: PagedKVCacheManager,
        request_ids: list,
        host: HostStepInputs,
        deferred: np.ndarray,
        source: torch.Tensor | None = None,
    ) -> StepInputs:
        """The inputs of a step that `stages` accepts, staged into the static buffers
        (`StepStaging.write`): its tensors are views of them, which the replay's first kernel
        fills (`run` replays without a copy). deferred: [d, 2] (batch index, source row) of
        the tokens the previous step's samples fill; source: those samples (`InFlightStep.
        sampled`): where they are this runner's `greedy_tokens` of the step before, the
        replay's unpack takes them (no feed: `StepInputs.deferred` None), else the feed
        writes them (`InFlightStep.feed`). Raises like `runtime_inputs` for requests without
        an allocation, before anything is staged."""
        n = len(request_ids)
        kv_host = manager.host_runtime_inputs(request_ids)
        t = self.buffers.tokens
        gather = (
            source is not None
            and source.dim() == 1
            and source.dtype == t.dtype
            and source.device == t.device
            and source.data_ptr() == t.data_ptr()
        )
        pairs = np.asarray(deferred, np.int64).reshape(-1, 2)
        dev = self.staging.write(kv_host, host, pairs, gather)
        s = self.buffers
        s._dirty = max(s._dirty, self.bucket(n))  # rows a later `load` makes pad rows again
        return StepInputs(
            request_ids=request_ids,
            num_new_tokens=[1] * n,
            input_ids=s.input_ids[:n],
            positions=s.positions[:n],
            q_row_offsets=s.q_row_offsets[: n + 1],
            slots=None,
            logits_rows=s.logits_rows[:n],
            sample_index=host.sample_index,
            kv_inputs=[s.kv_rows(n)],
            host=host,
            deferred=dev,
            num_decodes=n,
            staged=self.staging,
        )

    def greedy_tokens(self, inputs: StepInputs) -> torch.Tensor | None:
        """The argmax of each logits row of a replayed step that `stage_step` staged ([n]
        int64, `ops.fused.argmax_rows`' tokens, taken by the graph after its logits: a view of
        the buffers' `tokens`, valid until the next replay), or None for another step."""
        if inputs.staged is not self.staging:
            return None
        return self.buffers.tokens[: inputs.batch_size]

    def serves(self, inputs: StepInputs) -> bool:
        """Whether `inputs` is a pure decode step a graph replays: 1 to max_batch requests of
        one new token each, every one sampling, on one device."""
        n = inputs.batch_size
        return (
            1 <= n <= self.buckets[-1]
            and inputs.num_tokens == n
            and len(inputs.sample_index) == n
            and len(inputs.kv_inputs) == 1
        )

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [n, vocab] float32 of a step that `serves` accepts: a view of the static
        output, valid until the next `run`."""
        check(self.serves(inputs), "inputs", "a decode step the graphs serve", inputs.batch_size)
        n = inputs.batch_size
        if inputs.staged is not self.staging:  # device arrays: copied in, the unpack skipped
            self.buffers.load(inputs)
            self.staging.skip()
        self.graphs[self.bucket(n)].replay()
        self.num_replays += 1
        return self.buffers.logits[:n]


__all__ = [
    "PAD_REQUEST",
    "DecodeBuffers",
    "GraphRunner",
    "StepStaging",
    "aligned_row_steps",
    "decode_buckets",
    "graph_mode",
    "supports_cuda_graphs",
    "takes_num_decodes",
    "warm_up_steps",
    "warm_up_widths",
]
