"""LLM: the public facade. Builds an engine (model, scheduler, block managers, model runner) and generates.

    llm = minikv.LLM(model="tiny-kvshare", kv_cache_dtype="int8_per_token_head", max_num_seqs=4)
    outs = llm.generate(["3 7 11 15"], minikv.SamplingParams(max_tokens=12))
"""
from __future__ import annotations

import math
from typing import Sequence as Seq

import torch
from tqdm import tqdm

from minikv import bugs
from minikv.attention.backend import BACKENDS
from minikv.cache.blocks import BlockManager
from minikv.config import CacheConfig, EngineConfig, SchedulerConfig
from minikv.engine.model_runner import ModelRunner
from minikv.engine.scheduler import Scheduler
from minikv.engine.sequence import RequestOutput, SamplingParams, Sequence
from minikv.models import registry


def _resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available; use device='cpu'")
    return device


class LLM:
    """A minikv engine for one model. See DESIGN.md section 8 for the API."""

    def __init__(self, model: str = "tiny-kvshare", kv_cache_dtype: str = "auto", max_num_seqs: int = 8,
                 block_size: int = 16, enable_prefix_caching: bool = False, device: str = "cpu",
                 backend: str = "triton", reintroduce: Seq[str] = (), sanitize: bool = True,
                 check_layout: bool = True, seed: int = 0, cross_pool_blocks: int | None = None,
                 num_blocks: int | None = None, dtype: torch.dtype | None = None,
                 max_num_batched_tokens: int = 4096, cross_context_path: str = "fused",
                 paged_context: bool = False, cross_construction: str = "eager", warmup: str = "dummy"):
        if model not in registry.MODEL_NAMES:
            raise ValueError(f"unknown model {model!r}; known models: {', '.join(registry.MODEL_NAMES)}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        defects = bugs.validate(reintroduce)
        cache = CacheConfig(kv_cache_dtype=kv_cache_dtype, block_size=block_size, num_blocks=num_blocks,
                            cross_pool_blocks=cross_pool_blocks, enable_prefix_caching=enable_prefix_caching)
        sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        device = _resolve_device(device)
        torch.manual_seed(seed)
        self.model_name = model
        self.tokenizer = registry.get_tokenizer(model)
        net = registry.load_model(model, device=device, dtype=dtype)
        dtype = next(net.parameters()).dtype
        self.config = EngineConfig(model=net.config, cache=cache, scheduler=sched, device=device, dtype=dtype,
                                   backend=backend, reintroduce=tuple(sorted(defects)), sanitize=sanitize,
                                   check_layout=check_layout, seed=seed)
        self.runner = ModelRunner(self.config, net, pad_id=self.tokenizer.pad_id,
                                  cross_context_path=cross_context_path, paged_context=paged_context,
                                  cross_construction=cross_construction, warmup=warmup)
        self.is_encoder_decoder = net.config.is_encoder_decoder
        self._build_scheduler()
        self._next_id = 0

    def _build_scheduler(self) -> None:
        # Block managers describe the bytes of the current arena: a fresh arena needs fresh ones (a prefix-cache
        # entry must never outlive the bytes it points to).
        cache, sched = self.config.cache, self.config.scheduler
        self.block_manager = BlockManager(self.runner.num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.cross_block_manager = (BlockManager(self.runner.num_cross_blocks, cache.block_size, False)
                                    if self.is_encoder_decoder else None)
        self.scheduler = Scheduler(sched.max_num_seqs, sched.max_num_batched_tokens, self.block_manager,
                                   self.cross_block_manager, eos_token_id=self.tokenizer.eos_id)

    # ---- requests -----------------------------------------------------------------------------------------------
    def _encode(self, prompt: str) -> tuple[list[int], list[int] | None]:
        """(decoder prompt ids, encoder ids or None) for one prompt, with clear errors for bad input."""
        if not isinstance(prompt, str):
            raise TypeError(f"a prompt must be a str, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("empty prompt: give at least one character")
        ids = self.tokenizer.encode(prompt)
        mc = self.config.model
        if self.is_encoder_decoder:
            if len(ids) > mc.max_encoder_len:
                raise ValueError(f"prompt is {len(ids)} tokens, longer than the encoder's maximum "
                                 f"{mc.max_encoder_len}")
            return [self.tokenizer.bos_id], ids
        ids = [self.tokenizer.bos_id] + ids
        if len(ids) >= mc.max_position:
            raise ValueError(f"prompt is {len(ids)} tokens, the model's maximum is {mc.max_position - 1} "
                             f"(max_position {mc.max_position} includes room for one new token)")
        return ids, None

    def _make_sequence(self, prompt: str, params: SamplingParams) -> Sequence:
        ids, enc = self._encode(prompt)
        room = self.config.model.max_position - len(ids)
        if params.max_tokens > room:
            params = SamplingParams(max_tokens=room, temperature=params.temperature, seed=params.seed,
                                    stop=params.stop, ignore_eos=params.ignore_eos)
        seq = Sequence(self._next_id, prompt, ids, params, encoder_token_ids=enc, default_seed=self.config.seed)
        self._next_id += 1
        return seq

    def _check_fits(self, seq: Sequence) -> None:
        bs = self.config.cache.block_size
        need = math.ceil((len(seq.prompt_token_ids) + seq.sampling.max_tokens) / bs)
        if need > self.runner.num_blocks:
            raise ValueError(f"request {seq.request_id} needs {need} KV blocks (prompt + max_tokens) but the pool "
                             f"holds only {self.runner.num_blocks}; raise num_blocks or lower max_tokens")
        if seq.encoder_token_ids is not None:
            need = math.ceil(len(seq.encoder_token_ids) / bs)
            if need > self.runner.num_cross_blocks:
                raise ValueError(f"request {seq.request_id} needs {need} cross-pool blocks but the cross pool "
                                 f"holds only {self.runner.num_cross_blocks}; raise cross_pool_blocks")

    def cross_blocks_needed(self, prompts: Seq[str]) -> int:
        """Blocks the cross pool must hold to serve all of `prompts` at once."""
        if not self.is_encoder_decoder:
            raise ValueError(f"{self.model_name} has no cross attention")
        bs = self.config.cache.block_size
        return sum(math.ceil(len(self._encode(p)[1]) / bs) for p in prompts)

    # ---- generation ---------------------------------------------------------------------------------------------
    def generate(self, prompts: str | Seq[str], sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True, on_step=None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of `prompts`.

        `on_step(llm, batch, is_prefill)`, if given, is called after every forward step (before the batch's
        finished requests free their blocks): a hook for instrumentation that needs to look at the cache.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        if not prompts:
            return []
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        if self.runner.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        seqs = [self._make_sequence(p, sp) for p, sp in zip(prompts, params)]   # all checked before any runs
        for s in seqs:
            self._check_fits(s)
        for s in seqs:
            self.scheduler.add(s)
        # Passing `disable` only when asked keeps tqdm's own TQDM_DISABLE=1 switch working otherwise.
        bar = tqdm(total=len(seqs), desc="generate", leave=False, **({} if use_tqdm else {"disable": True}))
        try:
            while self.scheduler.has_unfinished():
                batch, is_prefill = self.scheduler.schedule()
                tokens = self.runner.execute(batch, is_prefill)
                if on_step is not None:
                    on_step(self, batch, is_prefill)
                self.scheduler.postprocess(batch, tokens)
                for s in batch:
                    self._apply_stop_strings(s)
                bar.update(sum(1 for s in seqs if s.finish_reason is not None) - bar.n)
        except BaseException:
            for s in seqs:                     # leave nothing half-done in the engine
                if s.finish_reason is None:
                    self.scheduler.abort(s.request_id)
            raise
        finally:
            bar.close()
        return [self._output(s) for s in seqs]

    def _apply_stop_strings(self, seq: Sequence) -> None:
        stops = seq.sampling.stop
        if not stops or seq.finish_reason is not None:
            return
        text = self.tokenizer.decode(seq.output_token_ids)
        if any(st in text for st in stops):
            self.scheduler.finish(seq, "stop")

    def _output(self, seq: Sequence) -> RequestOutput:
        ids = list(seq.output_token_ids)
        text = self.tokenizer.decode(ids)
        if seq.sampling.stop:
            cut = min((text.find(st) for st in seq.sampling.stop if st in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return RequestOutput(seq.request_id, seq.prompt, text, ids, seq.finish_reason)

    # ---- memory -----------------------------------------------------------------------------------------------
    def sleep(self, mode: str = "free") -> None:
        """Release the KV cache (requests must be finished): mode "free" drops the arena, "discard" (vLLM's
        shape) keeps its storage and addresses and discards the contents."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("cannot sleep with unfinished requests")
        self.runner.sleep(mode)

    def wake_up(self) -> None:
        """Bring the KV cache back (a fresh arena after mode "free"), re-initialize it and warm up again."""
        if self.runner.asleep:
            self.runner.wake_up()
            self._build_scheduler()

    @property
    def arena(self):
        return self.runner.arena

    @property
    def census(self):
        """The scale-fill census of this engine (defect A instrumentation)."""
        return self.runner.census
