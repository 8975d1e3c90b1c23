"""`LLMEngine`: requests in, tokens out, one model step at a time.

    engine = LLMEngine("ckpt/", device="cuda", page_size=16, gpu_memory_utilization=0.9)
    rid = engine.add_request("Hello", SamplingParams(max_tokens=32))
    while engine.has_unfinished_requests():
        for out in engine.step():        # the requests that got a token this step
            print(out.request_id, out.outputs[0].new_text)

A step: `Scheduler.schedule()` (admission, chunked prefill, preemption; `alloc` for each
request) -> `build_step_inputs` (ids, positions, offsets, slots, logits rows, kv_inputs) ->
`ModelRunner.execute` (the model writes the new K/V and returns the logits rows; on CUDA a pure
decode step replays a captured CUDA graph, `cuda_graphs.py`) -> `sample` on the device ->
`Scheduler.update` (`manager.step`, stop checks, `release`).

Faults: a prompt the cache could never hold raises `PromptTooLongError` in `add_request`, with
nothing enqueued. An exception inside a step (the model, the sampler, a device error) propagates
after nothing was committed: every request keeps its committed tokens (the step's allocations
stay reserved and are reused), the manager's invariants hold, and the next `step()` retries the
work; `abort_request` drops a request for good.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import random
import time
from collections.abc import Sequence as SequenceABC
from pathlib import Path

import numpy as np
import torch

from ..cache.buffers import StagingRing
from ..cache.manager import PagedKVCacheManager
from ..cache.params import KVQuantConfig
from ..errors import (
    INT64_MAX,
    InvalidArgumentError,
    UnknownRequestError,
    check,
    check_bool,
    check_int,
)
from ..models import ModelConfig, kv_cache_params, load_model, parallel
from .cuda_graphs import GraphRunner, graph_mode
from .errors import NoTokenizerError, NotSupportedYetError, PromptTooLongError
from .inflight import InFlightStep, TokenRing
from .metrics import EngineStats
from .mixed_graphs import MixedGraphRunner, supports_piecewise_graphs
from .model_runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput
from .sampler import SamplingTensors, sample
from .sampler import warm_up as warm_up_sampler
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence, SequenceStatus
from .step_inputs import build_step_inputs
from .tokenizer import Tokenizer, load_tokenizer

Prompt = str | dict | SequenceABC  # text, {"prompt_token_ids": [...]} or a list of token ids

# Default pool without a memory budget (CPU): this many tokens (at most max_model_len * 4).
_CPU_DEFAULT_TOKENS = 16384


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class LLMEngine:
    """An offline engine over one model and one paged KV cache.

    model: a checkpoint folder (loaded with `models.load_model`) or a loaded model (an
      `nn.Module` with the step `forward`, `config` (a models.ModelConfig), `dtype` and
      `attach_kv_cache`).
    device / dtype: where and in what dtype to load a folder (default: CUDA when available, the
      checkpoint's dtype). A loaded model keeps its own.
    page_size: tokens per KV page (any int >= 1).
    num_pages / gpu_memory_utilization: the pool's size, at most one of them. The fraction of the
      GPU's memory for the whole process (weights, activations and the cache; default 0.9 on
      CUDA); on the CPU the default pool holds min(16384, 4 * max_model_len) tokens.
    max_num_batched_tokens: the step's token budget (decodes + prefill chunks).
    max_num_seqs: most requests running at once.
    max_model_len: most tokens (prompt + generated) of a request (default: the config's
      max_position_embeddings), capped by what the pool holds.
    tensor_parallel_size: N > 1 shards the model over torch.distributed's N ranks (one process
      each, the default group initialized with world size N; gloo on the CPU, nccl on CUDA,
      `device` this rank's GPU): every rank builds the same engine on the same calls and gets
      the same tokens (docs/engine.md). The Llama family, its MoE variants and gpt-oss
      (DeepSeek raises NotSupportedYetError); num_heads, num_kv_heads and the intermediate
      sizes (dense, experts', shared expert's) must divide by N.
    tokenizer: a folder or tokenizer object (default: the checkpoint folder's, if any).
    enable_prefix_caching / kv_quantization: the cache's (`KVCacheParams`).
    seed: seeds the per-request seeds of requests without one.
    async_scheduling: overlap the host's work for a step (scheduling, inputs, launch) with the
      device's work for the previous one (default: on CUDA). Step n + 1 is scheduled and
      launched before step n's tokens reach the host: it reads them on the device, and its
      requests' length limits are known ahead; a stop token is seen one step late, so a request
      that stops has one more step's work computed and dropped. `step()` then returns the
      outputs of the step launched by the previous call (the first call returns none), and
      `has_unfinished_requests()` stays True until the last step is read. The tokens are the
      same as without it (sampling is keyed per request and token index).
    enforce_eager: never use CUDA graphs. Otherwise, on CUDA with a capturable model
      (`supports_cuda_graphs`: the Llama family; not gpt-oss), decode steps replay graphs
      captured here (with tensor parallelism, each rank's, its all-reduces inside) for batch
      sizes `decode_buckets(min(max_num_seqs, max_num_batched_tokens))`; the cache then holds
      one more page (the pad page, not counted in `num_pages` or the stats).

    On CUDA, construction ends with `gc.unfreeze()`, `gc.collect()` and `gc.freeze()`: what
    start-up made (the model, graphs, caches, imported libraries) is left out of later full
    collections, whose scans stalled serving steps by up to ~270 ms (docs/engine.md).
    """

    #: Tests only: run the decode graphs' static-buffer path eagerly ("emulated") on any device.
    _emulate_cuda_graphs = False
    #: Probes only: False keeps steps with prefill chunks eager where pieces would serve them
    #: (an A/B of the piecewise graphs, `dev/profile_engine_step.py --no-pieces`).
    _piecewise_graphs = True

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        page_size: int = 16,
        num_pages: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        tokenizer: object | None = None,
        enable_prefix_caching: bool = True,
        kv_quantization: KVQuantConfig | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        async_scheduling: bool | None = None,
    ) -> None:
        tp = check_int("tensor_parallel_size", tensor_parallel_size, 1)
        if tp > 1 and not isinstance(model, (str, os.PathLike)) and not hasattr(model, "tp_size"):
            raise NotSupportedYetError(
                f"tensor_parallel_size={tp}: {type(model).__name__} has no tensor-parallel "
                "shards (give a checkpoint folder, or a model built with tp_size)"
            )
        if tp > 1:
            parallel.check_tp(tp)  # torch.distributed initialized, world size tp
        page_size = check_int("page_size", page_size, 1)
        max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        enforce_eager = check_bool("enforce_eager", enforce_eager)
        check(
            num_pages is None or gpu_memory_utilization is None,
            "num_pages/gpu_memory_utilization",
            "at most one of them",
            f"num_pages={num_pages!r}, gpu_memory_utilization={gpu_memory_utilization!r}",
        )
        folder = None
        if isinstance(model, (str, os.PathLike)):
            folder = Path(model)
            dev = torch.device(device) if device is not None else _default_device()
            if tp > 1:
                self._check_tp_config(ModelConfig.from_hf(folder), tp)
                model = load_model(folder, device=dev, dtype=dtype, tp_size=tp)
            else:
                model = load_model(folder, device=dev, dtype=dtype)
        else:
            check(isinstance(model, torch.nn.Module), "model", "a folder or an nn.Module", model)
            dev = torch.device(device) if device is not None else _model_device(model)
            check(
                dtype is None or dtype == model.dtype,
                "dtype",
                f"None or the loaded model's dtype {model.dtype}",
                dtype,
            )
            if tp > 1:
                self._check_tp_config(model.config, tp)
            check(
                getattr(model, "tp_size", 1) == tp,
                "model",
                f"a model built with tp_size={tp} (tensor_parallel_size)",
                f"tp_size={getattr(model, 'tp_size', 1)}",
            )
        self.model = model
        self.tp_size = tp
        self.device = dev
        mode = graph_mode(
            model, dev, enforce_eager=enforce_eager, tp_size=tp, emulate=self._emulate_cuda_graphs
        )
        graph_batch = min(max_num_seqs, max_num_batched_tokens) if mode else 0
        # steps with prefill chunks: captured in pieces (mixed_graphs.py) on one device
        piecewise = (
            self._piecewise_graphs
            and mode is not None
            and tp == 1
            and supports_piecewise_graphs(model)
        )
        self.config = cfg = model.config
        self.tokenizer: Tokenizer | None = load_tokenizer(
            tokenizer if tokenizer is not None else folder
        )
        if tokenizer is not None and self.tokenizer is None:
            raise NoTokenizerError(f"tokenizer: no tokenizer files in {str(tokenizer)!r}")

        # KV cache.
        params = kv_cache_params(
            cfg,
            dtype=model.dtype,
            page_size=page_size,
            devices=[dev],
            quantization=kv_quantization,
            enable_prefix_caching=enable_prefix_caching,
        )
        # Tensor parallelism: this rank's cache holds its KV-head shard; the manager (and the
        # scheduler) are the same on every rank, so every rank allocates the same page ids.
        params = parallel.tp_kv_cache_params(params, tp)
        want_len = cfg.max_position_embeddings if max_model_len is None else max_model_len
        want_len = check_int("max_model_len", want_len, 1, 2**31 - 1)
        if num_pages is None:
            num_pages = self._pool_pages(
                params,
                gpu_memory_utilization,
                want_len,
                max_num_batched_tokens,
                max_num_seqs,
                graph_batch,
                piecewise,
            )
        num_pages = check_int("num_pages", num_pages, 1, 2**31 - 1)
        capacity = num_pages * page_size
        if max_model_len is not None and max_model_len > capacity:
            raise InvalidArgumentError(
                f"max_model_len: {max_model_len} tokens do not fit the KV cache "
                f"({num_pages} pages of {page_size} = {capacity} tokens)"
            )
        self.max_model_len = min(want_len, capacity)
        model.attach_kv_cache(params)
        # With graphs, one more page and batch slot for the pad request (cuda_graphs.py).
        self._reserved_pages = 1 if mode else 0
        self.manager = PagedKVCacheManager(
            params,
            total_num_pages=num_pages + self._reserved_pages,
            max_batch_size=max_num_seqs + self._reserved_pages,
            max_seq_len=self.max_model_len,
        )
        self.kv_params = params
        self.scheduler = Scheduler(
            self.manager,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
            eos_token_ids=self._eos_ids(folder),
            stop_text=self._stop_text,
        )
        graphs = (
            GraphRunner(model, self.manager, graph_batch, emulate=mode == "emulated")
            if mode
            else None
        )
        if graphs is not None and mode == "cuda":
            graphs.warm_up_eager(max_num_batched_tokens)  # compiles now, not mid-stream
        mixed = (
            MixedGraphRunner(model, graphs, max_num_batched_tokens, emulate=mode == "emulated")
            if graphs is not None and piecewise
            else None
        )
        if dev.type == "cuda":
            warm_up_sampler(cfg.vocab_size, dev)  # the sampler's argmax too
            # start-up's objects out of later full collections (class docstring); unfrozen
            # first, so what an earlier engine froze and has since dropped is collected here
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        self.runner = ModelRunner(model, dev, graphs, mixed)
        self._rng = random.Random(check_int("seed", seed, 0))
        self._ids = itertools.count()
        self._seqs: dict[int, Sequence] = {}
        self._stats = EngineStats()
        self.async_scheduling = (
            dev.type == "cuda"
            if async_scheduling is None
            else check_bool("async_scheduling", async_scheduling)
        )
        self._inflight: InFlightStep | None = None
        self._token_ring = TokenRing()
        # sampled rows' parameters (and a commit's kept rows): one pinned, non-blocking copy
        # on CUDA
        self._sampling_stage = StagingRing(dev).stage if dev.type == "cuda" else None
        self._finished_at_launch = 0  # scheduler.num_finished when the last step was scheduled
        self._carried: list[Sequence] = []  # resolved by a step that then failed

    # Construction helpers ----------------------------------------------------------------
    @staticmethod
    def _check_tp_config(cfg, tp: int) -> None:
        if cfg.is_mla:
            raise NotSupportedYetError(
                f"tensor_parallel_size={tp}: {cfg.architecture} (an MLA model) is not sharded "
                "yet; tensor parallelism covers the Llama family (Llama, Mistral, Qwen2, Qwen3), "
                "its MoE variants (Mixtral, Qwen2-MoE, Qwen3-MoE) and gpt-oss"
            )
        parallel.check_divisible(cfg, tp)

    def _pool_pages(
        self,
        params,
        utilization: float | None,
        max_len: int,
        max_tokens: int,
        max_seqs: int,
        graph_batch: int,
        piecewise: bool = False,
    ) -> int:
        dev = self.device
        if dev.type != "cuda":
            check(
                utilization is None,
                "gpu_memory_utilization",
                "None on a CPU device (give num_pages)",
                utilization,
            )
            tokens = min(_CPU_DEFAULT_TOKENS, 4 * max_len)
            return math.ceil(tokens / params.page_size)
        util = 0.9 if utilization is None else utilization
        check(
            isinstance(util, float) and 0 < util <= 1,
            "gpu_memory_utilization",
            "a float in (0, 1]",
            util,
        )
        total = torch.cuda.get_device_properties(dev).total_memory
        used = torch.cuda.memory_reserved(dev)  # the weights, loaded already
        act = self._activation_bytes(max_tokens, max_seqs, graph_batch, piecewise)
        budget = int(total * util) - used - act
        if budget < params.bytes_per_page():
            raise InvalidArgumentError(
                f"gpu_memory_utilization: {util} of {total / 2**30:.1f} GiB leaves no room for "
                f"the KV cache ({used / 2**30:.1f} GiB in use, about {act / 2**30:.1f} GiB "
                "kept for activations)"
            )
        return params.pages_for_memory(budget)

    def _activation_bytes(self, max_tokens: int, max_seqs: int, graph_batch: int = 0,
                          piecewise: bool = False) -> int:  # fmt: skip
        """A generous estimate of one step's peak activations (float32 worst case): the
        layer's temporaries for every token, the logits and the sampler's copies of them for
        every request, and 256 MiB of slack; plus, with CUDA graphs of up to `graph_batch`
        rows, the graphs' pool (the largest one's temporaries and logits) and static logits;
        plus, with piecewise graphs of mixed steps, their pool (the largest bucket's
        temporaries) and their static q and attention output."""
        c = self.config
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        if c.is_mla:  # q, the 576-element latent row, and the expanded K and V of a context
            qk = c.qk_nope_head_dim + c.qk_rope_head_dim
            qkv = c.num_heads * (2 * qk + c.v_head_dim) + c.mla_head_dim
        per_token = 4 * (6 * c.hidden_size + 3 * c.intermediate_size + 2 * qkv)
        graphs = graph_batch * (per_token + 2 * c.vocab_size * 4)
        if piecewise:
            graphs += max_tokens * (per_token + 2 * c.num_heads * c.head_dim * 4)
        return max_tokens * per_token + 4 * max_seqs * c.vocab_size * 4 + graphs + (256 << 20)

    def _eos_ids(self, folder: Path | None) -> tuple[int, ...]:
        ids = set(self.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen = folder / "generation_config.json" if folder is not None else None
        if gen is not None and gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list):
                ids.update(int(e) for e in eos)
        return tuple(sorted(ids))

    # Requests ----------------------------------------------------------------------------
    def _prompt_tokens(self, prompt: Prompt) -> tuple[list[int], str | None]:
        text = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise NoTokenizerError(
                    "prompt: a text prompt needs a tokenizer (none in the checkpoint folder); "
                    'give {"prompt_token_ids": [...]} instead'
                )
            text, tokens = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict):
            check(
                "prompt_token_ids" in prompt,
                "prompt",
                'a dict with "prompt_token_ids"',
                sorted(prompt),
            )
            tokens = prompt["prompt_token_ids"]
        else:
            tokens = prompt
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 1:
            tokens = tokens.tolist()
        check(
            isinstance(tokens, (list, tuple)),
            "prompt_token_ids",
            "a list of token ids",
            type(tokens).__name__,
        )
        bad = [t for t in tokens if not isinstance(t, (int, np.integer)) or isinstance(t, bool)]
        check(not bad, "prompt_token_ids", "ints", bad[:5])
        tokens = [int(t) for t in tokens]
        check(len(tokens) >= 1, "prompt_token_ids", "at least one token", len(tokens))
        V = self.config.vocab_size
        bad = [t for t in tokens if not 0 <= t < V]
        check(not bad, "prompt_token_ids", f"token ids in [0, vocab_size={V})", bad[:5])
        if len(tokens) > self.max_model_len:
            raise PromptTooLongError(
                f"prompt: {len(tokens)} tokens exceed max_model_len={self.max_model_len} "
                f"(the KV cache holds {self.manager.total_num_pages} pages of "
                f"{self.kv_params.page_size} tokens)"
            )
        return tokens, text

    def _new_sequence(self, prompt: Prompt, params: SamplingParams | None) -> Sequence:
        params = SamplingParams() if params is None else params
        check(isinstance(params, SamplingParams), "sampling_params", "a SamplingParams", params)
        check(
            not params.stop or self.tokenizer is not None,
            "SamplingParams.stop",
            "stop strings only on an engine with a tokenizer (this one has none: give "
            "`tokenizer=`, or use stop_token_ids)",
            repr(params.stop),
        )
        tokens, text = self._prompt_tokens(prompt)
        seed = params.seed if params.seed is not None else self._rng.randrange(INT64_MAX)
        return Sequence(next(self._ids), tokens, params, seed, prompt=text)

    def _enqueue(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> int:
        """Queue a request; returns its id. Raises PromptTooLongError, NoTokenizerError or
        InvalidArgumentError (nothing queued, other requests undisturbed)."""
        seq = self._new_sequence(prompt, sampling_params)
        self._enqueue(seq)
        return seq.request_id

    def abort_request(self, request_id: int) -> None:
        """Drop a queued or running request (its pages are freed). Raises UnknownRequestError
        for an id that is not in flight."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            raise UnknownRequestError(f"request_id: {request_id!r} is not in flight")
        self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        # (a request whose sample is in flight is still running: its step is read before
        # it can finish)
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    # Steps -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; the outputs of the requests that got a token (with text deltas). With
        `async_scheduling`, those of the step launched by the previous call."""
        seqs = self._step()
        if self.tokenizer is not None:
            return [self._output(s, delta=True) for s in seqs]
        # `_output(s, delta=True)` without a tokenizer, inlined (every request, every step)
        FINISHED = SequenceStatus.FINISHED
        out = []
        for s in seqs:
            toks = s._known
            done = s.status is FINISHED
            completion = CompletionOutput(
                0, toks, None, s.finish_reason, s.stop_reason, toks[-1:], None
            )
            out.append(
                RequestOutput(
                    s.request_id, s.prompt, s.prompt_token_ids, [completion], done, s.metrics
                )  # fmt: skip
            )
        return out

    def _step(self) -> list[Sequence]:
        """One step; the sequences that got a token (finished ones are dropped from _seqs).

        Synchronous: launch step n (schedule, inputs, model, sample), commit it, read its
        tokens, resolve. Overlapped (`async_scheduling`): launch step n + 1 while step n runs
        on the device (its sampled tokens feed n + 1's inputs on the device), then read and
        resolve step n's tokens, then commit n + 1, whose tokens the next call resolves. A
        failed launch propagates after step n is resolved (its outputs come with the next
        call) and nothing of n + 1 was committed."""
        t0 = time.perf_counter()
        prev, self._inflight = self._inflight, None
        out, self._carried = self._carried, []
        try:
            launched = self._launch(prev)
        except BaseException:
            self._stats.failed_steps += 1
            if prev is not None:
                self._carried = out + self._resolve(prev)
            raise
        if prev is not None:
            out += self._resolve(prev)
        if launched is not None:
            flight = self._commit(*launched)
            if self.async_scheduling:
                self._inflight = flight
            elif flight is not None:
                out += self._resolve(flight)
        self._stats.num_steps += launched is not None
        self._stats.step_time_s += time.perf_counter() - t0
        return out

    def _launch(self, prev: InFlightStep | None):
        """Schedule and run one step up to its sampled tokens (on the device); None when
        nothing is scheduled. Deferred input tokens are filled from `prev`'s samples."""
        batch = self.scheduler.schedule()
        self._finished_at_launch = self.scheduler.num_finished
        self._note_pages()
        if not batch.seqs:
            return None
        inputs = build_step_inputs(
            self.manager,
            [(s.request_id, s._tokens, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
            self.device,
            prev.deferred_rows(batch.seqs) if prev is not None else (),
            graphs=getattr(self.runner, "graphs", None) if batch.all_decodes else None,
            deferred_source=prev.sampled if prev is not None else None,
        )
        if prev is not None:
            prev.feed(inputs)
        logits = self.runner.execute(inputs)
        index = inputs.sample_index  # ascending batch indices
        rows = batch.seqs if len(index) == len(batch) else [batch.seqs[i] for i in index]
        st = SamplingTensors.build(
            [s.params for s in rows],
            (s.seed for s in rows),  # (read only when some row samples at random)
            (len(s.output_token_ids) for s in rows),
            logits.shape[-1],
            self.device,
            self._sampling_stage,
        )
        greedy = getattr(self.runner, "greedy_tokens", None)
        sampled = greedy(inputs) if greedy is not None and st.all_greedy else None
        if sampled is None:  # (else the replay took the argmax: no launch here)
            sampled = sample(logits, st)
        # Every rank has the same logits after the all-reduces; rank 0's tokens are taken
        # anyway, so no rounding difference can make the ranks' schedulers diverge.
        sampled = parallel.broadcast(sampled, self.tp_size)
        if not self.async_scheduling:  # read here: a device error raises before the commit
            sampled = sampled.cpu()
        if not batch.all_decodes:
            self._stats.prompt_tokens += sum(
                n for s, n in zip(batch.seqs, batch.num_new_tokens) if not s.is_decode
            )
        return batch, sampled

    def _commit(self, batch: ScheduledBatch, sampled: torch.Tensor) -> InFlightStep | None:
        """Commit a launched step (its samples deferred); requests that finished since it was
        scheduled (a stop token resolved meanwhile) are left out, their work dropped."""
        FINISHED = SequenceStatus.FINISHED
        if self.scheduler.num_finished != self._finished_at_launch and any(
            s.status is FINISHED for s in batch.seqs
        ):  # (a request of the batch can have finished only if some request did)
            keep = [i for i, s in enumerate(batch.seqs) if not s.finished]
            rows = [i for i in range(len(batch)) if batch.samples(i)]
            src = {i: k for k, i in enumerate(rows)}
            batch = ScheduledBatch(
                [batch.seqs[i] for i in keep], [batch.num_new_tokens[i] for i in keep]
            )
            rows = np.array([src[i] for i in keep if i in src], np.int64)
            # (staged on CUDA: indexing with a host list copies it and waits for the stream)
            sampled = sampled[self._sampling_stage([rows])[0] if self._sampling_stage else rows]
        seqs = self.scheduler.commit(batch)
        return InFlightStep(seqs, sampled, self._token_ring) if seqs else None

    def _resolve(self, flight: InFlightStep) -> list[Sequence]:
        """Read a committed step's tokens (waits for its device work) and resolve them."""
        before = self.scheduler.num_finished
        updated = self.scheduler.resolve(flight.seqs, flight.tokens())
        s = self._stats
        s.generated_tokens += len(updated)
        if self.scheduler.num_finished != before:  # (else none of them finished)
            for seq in updated:
                if seq.finished:
                    s.finished_requests += 1
                    self._seqs.pop(seq.request_id, None)
        return updated

    def _note_pages(self) -> None:
        used = self.manager.stats().used_pages - self._reserved_pages
        self._stats.peak_used_pages = max(self._stats.peak_used_pages, used)

    # Outputs -----------------------------------------------------------------------------
    def _output(self, seq: Sequence, *, delta: bool) -> RequestOutput:
        toks = seq.known_output_token_ids
        text = new_text = None
        if self.tokenizer is not None:
            if delta and not seq.finished:
                new_text = self._text_delta(seq, toks)
                text = seq.text_sent
            else:
                text = self.tokenizer.decode(toks)
                if seq.text_end is not None:  # a stop string ended it
                    text = text[: seq.text_end]
                if delta:  # the last delta: whatever the whole text adds to what was sent
                    sent = seq.text_sent
                    new_text = text[len(sent) :] if text.startswith(sent) else text
                    seq.text_sent = sent + new_text
        # (positional arguments, in the fields' order: a dataclass's keyword call costs about
        # twice as much, and this runs for every request every step)
        completion = CompletionOutput(
            0,  # index
            toks,  # token_ids
            text,
            seq.finish_reason,
            seq.stop_reason,
            toks[-1:] if delta else toks,  # new_token_ids
            new_text if delta else text,  # new_text
        )
        return RequestOutput(
            seq.request_id,
            seq.prompt,
            seq.prompt_token_ids,  # the sequence's own list (never changed)
            [completion],  # outputs
            seq.finished,
            seq.metrics,
        )

    def _stop_text(self, seq: Sequence) -> str | None:
        """The stop string (`SamplingParams.stop`) that the request's newest token completed,
        or None; sets `seq.text_end`, where its text then ends. Each step decodes a window of
        the last tokens (4 a character of the longest stop string, and 8 more: enough for the
        new token's characters and a match ending in them); only a window that holds a stop
        string decodes the whole output, whose earliest match is the one (no earlier step saw
        one, so it ends in the new token)."""
        p = seq.params
        toks = seq.known_output_token_ids
        window = self.tokenizer.decode(toks[-(4 * p.longest_stop + 8) :])
        if not any(t in window for t in p.stop):
            return None
        text = self.tokenizer.decode(toks)
        found = [(text.find(t), k, t) for k, t in enumerate(p.stop) if t in text]
        if not found:  # (the window decoded otherwise than the whole text)
            return None
        at, _, hit = min(found)
        seq.text_end = at + (len(hit) if p.include_stop_str_in_output else 0)
        return hit

    def _text_delta(self, seq: Sequence, toks: list[int]) -> str:
        """Incremental detokenization: the text `toks` add to what was sent, decoding only
        the tokens since the previous delta (a window that starts one delta back, so that a
        tokenizer's context-dependent spacing cancels out) instead of the whole output each
        step. A trailing incomplete character (U+FFFD) is held back until its bytes are all
        there. The finished request's last delta comes from the whole text (`_output`)."""
        start, read = seq.detok_offsets
        prefix = self.tokenizer.decode(toks[start:read])
        window = self.tokenizer.decode(toks[start:])
        if len(window) <= len(prefix) or window.endswith("\ufffd"):
            return ""
        new = window[len(prefix) :]
        seq.detok_offsets = (read, len(toks))
        hold = seq.params.stop_hold
        if hold:  # what could still start a stop string waits (the finished text cuts it)
            held = seq.text_held + new
            cut = max(0, len(held) - hold)
            new, seq.text_held = held[:cut], held[cut:]
        seq.text_sent += new
        return new

    # Metrics -----------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Counters since construction or `reset_stats()` (a copy)."""
        m = self.manager.stats()
        s = self._stats
        sched = self.scheduler
        return EngineStats(
            **{
                **s.__dict__,
                "prefix_query_tokens": sched.prefix_query_tokens - self._base[0],
                "prefix_hit_tokens": sched.prefix_hit_tokens - self._base[1],
                "preemptions": sched.num_preemptions - self._base[2],
                "deduplicated_pages": m.deduplicated_pages - self._base[3],
                "total_pages": m.total_pages - self._reserved_pages,
                "used_pages": m.used_pages - self._reserved_pages,
            }
        )

    _base = (0, 0, 0, 0)

    def reset_stats(self) -> None:
        sched, m = self.scheduler, self.manager.stats()
        self._base = (
            sched.prefix_query_tokens,
            sched.prefix_hit_tokens,
            sched.num_preemptions,
            m.deduplicated_pages,
        )
        self._stats = EngineStats()


__all__ = ["LLMEngine", "Prompt"]
