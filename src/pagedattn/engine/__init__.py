"""The reference engine (layer 4): a vLLM-shaped offline API over the paged KV cache.

    from pagedattn.engine import LLM, SamplingParams
    llm = LLM("ckpt/", page_size=16, num_pages=4096, max_num_batched_tokens=2048)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.7, seed=1))

A file per concern: `sampling_params`, `sequence` (a request's state), `scheduler` (continuous
batching, chunked prefill, prefix caching, preemption), `step_inputs` (what a model step
needs), `model_runner` (the model call, eager or a replayed CUDA graph: `cuda_graphs`),
`sampler` (on the device), `outputs`, `metrics`, `tokenizer`, `llm_engine` (the step loop) and
`llm` (generate / stream).
docs/engine.md describes the API, the scheduler's policy and the step inputs.
"""

from .errors import NoTokenizerError, NotSupportedYetError, PromptTooLongError
from .llm import LLM
from .llm_engine import LLMEngine
from .metrics import EngineStats
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .sampler import SamplingTensors, sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence, SequenceStatus
from .step_inputs import StepInputs, build_step_inputs

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineStats",
    "LLMEngine",
    "NoTokenizerError",
    "NotSupportedYetError",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "SamplingTensors",
    "ScheduledBatch",
    "Scheduler",
    "Sequence",
    "SequenceStatus",
    "StepInputs",
    "build_step_inputs",
    "sample",
]
