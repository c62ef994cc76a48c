"""LLM: the public facade. Builds an engine (model, scheduler, block managers, model runner) and runs it.
See docs/internals.md#engine-llm."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

import torch
from tqdm import tqdm

from minikv.cache.arena import KVCacheOverrunError
from minikv.cache.blocks import BlockManager, slot_of
from minikv.config import (SLEEP_MODES, CacheConfig, EngineConfig, ReproConfig, SchedulerConfig, check_bool,
                           check_choice, check_int)
from minikv.engine import chat
from minikv.engine.errors import ConcurrentUseError, EngineNeedsResetError
from minikv.engine.memory import MaxModelLenError
from minikv.engine.model_runner import ModelRunner
from minikv.engine.outputs import CompletionOutput, Logprob, RequestOutput
from minikv.engine.prompts import Prompt, PromptEncoder, PromptInput, parse_prompt, parse_prompts
from minikv.engine.sampling_params import SamplingParams
from minikv.engine.progress import held_warnings
from minikv.engine.scheduler import Scheduler
from minikv.engine.sequence import Sequence
from minikv.engine.step import StepOutput, StepTrace
from minikv.kernels.errors import InvalidTypeError, InvalidValueError
from minikv.models import registry, tasks


class LLM:
    """A minikv engine for one model; its arguments: docs/internals.md#engine-llm."""

    def __init__(self, model: str = "tiny-gemma4", kv_cache_dtype: str = "auto", max_num_seqs: int = 8,
                 block_size: int = 16, enable_prefix_caching: bool = False, device: str = "cpu",
                 backend="triton", reintroduce: Iterable[str] = (), sanitize: bool = True,
                 seed: int = 0, cross_pool_blocks: int | None = None, num_blocks: int | None = None,
                 dtype: torch.dtype | None = None, max_num_batched_tokens: int = 4096,
                 kv_scale_placement: str = "row", repro: ReproConfig | None = None,
                 enforce_eager: bool | None = None, max_model_len: int | None = None,
                 kv_cache_memory_bytes: int | None = None, gpu_memory_utilization: float = 0.9,
                 kv_sharing_fast_prefill: bool = False, **moved):
        if moved:
            raise ReproConfig.moved_keywords_error(moved)
        model = registry.check_model(model)
        # Every option is checked once, by the config objects, before any weights are read or memory allocated.
        config = EngineConfig(
            model=None, device=device, dtype=dtype, backend=backend, reintroduce=reintroduce, sanitize=sanitize,
            seed=seed, repro=ReproConfig() if repro is None else repro, enforce_eager=enforce_eager,
            cache=CacheConfig(kv_cache_dtype=kv_cache_dtype, block_size=block_size, num_blocks=num_blocks,
                              cross_pool_blocks=cross_pool_blocks, enable_prefix_caching=enable_prefix_caching,
                              kv_scale_placement=kv_scale_placement, kv_cache_memory_bytes=kv_cache_memory_bytes,
                              gpu_memory_utilization=gpu_memory_utilization,
                              kv_sharing_fast_prefill=kv_sharing_fast_prefill),
            scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                      max_model_len=max_model_len))
        torch.manual_seed(seed)
        self.model_name = model
        self.tokenizer = registry.get_tokenizer(model)
        # A shipped model refuses prompts outside its task's documented domain (ValueError naming the bound).
        self.task = tasks.for_model(model) if registry.is_checkpoint_model(model) else None
        net = registry.load_model(model, device=config.device, dtype=config.dtype)
        # The model-dependent rules (a defect that cannot happen here, cross options on a decoder-only model).
        self.config = config.with_model(net.config, next(net.parameters()).dtype)
        self.runner = ModelRunner(self.config, net, pad_id=self.tokenizer.pad_id)
        self.is_encoder_decoder = net.config.is_encoder_decoder
        self._build_scheduler()
        self._prompts = PromptEncoder(self.tokenizer, self.config.model, self.task, model)
        self._next_id = 0
        self._requests: dict[int, tuple[PromptInput, list[Sequence]]] = {}   # request id -> (prompt, sequences)
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._needs_reset: str | None = None

    def _build_scheduler(self) -> None:
        # A fresh arena needs fresh block managers: a prefix-cache entry must never outlive the bytes it points to.
        cache, sched = self.config.cache, self.config.scheduler
        self.block_manager = BlockManager(self.runner.num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.cross_block_manager = (BlockManager(self.runner.num_cross_blocks, cache.block_size, False)
                                    if self.is_encoder_decoder else None)
        self.scheduler = Scheduler(sched.max_num_seqs, sched.max_num_batched_tokens, self.block_manager,
                                   self.cross_block_manager, eos_token_id=self.tokenizer.eos_id)

    # ---- one thread at a time, and no use after an overrun ------------------------------------------------------
    @contextlib.contextmanager
    def _exclusive(self, usable: bool = True):
        me = threading.get_ident()
        if self._owner == me:                     # re-entered from our own call (generate -> step)
            yield
            return
        if not self._lock.acquire(blocking=False):
            raise ConcurrentUseError("this LLM is already running a call from another thread; an engine serves "
                                     "one thread at a time: give each thread its own LLM, or serialize the calls")
        self._owner = me
        try:
            if usable:
                self._check_usable()
            yield
        finally:
            self._owner = None
            self._lock.release()

    def _check_usable(self) -> None:
        if self._needs_reset is not None:
            raise EngineNeedsResetError(f"{self._needs_reset}; the cache contents are untrusted and every request "
                                        f"in flight was aborted. Call llm.reset() (or llm.sleep() then "
                                        f"llm.wake_up()) to get a fresh arena")
        if self.runner.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt tokens + max_tokens) a request may have (minikv.engine.memory)."""
        return self.runner.max_model_len

    def _longer_hint(self) -> str:
        if self.max_model_len >= self.config.model.max_position:
            return f"shorten the prompt (the model's context length is {self.config.model.max_position})"
        return (f"for a longer request give max_model_len (up to the model's {self.config.model.max_position}) with "
                f"a cache that holds it (kv_cache_memory_bytes or num_blocks)")

    def _prepare(self, prompt: PromptInput, params, name: str) -> tuple:
        """Check one request completely, without touching the engine (`name`: how an error names it)."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidTypeError(f"sampling params must be a minikv.SamplingParams, got {type(params).__name__}")
        ids, enc = self._prompts.encode(prompt, name)
        if enc is None and len(ids) >= self.max_model_len:
            with_bos = " (with BOS)" if prompt.main.token_ids is None else ""
            raise MaxModelLenError(f"{name} is {len(ids)} tokens{with_bos}, which leaves no room to generate: "
                                   f"max_model_len is {self.max_model_len}, so at most {self.max_model_len - 1} "
                                   f"prompt tokens; " + self._longer_hint())
        room = self.max_model_len - len(ids)
        if params.max_tokens > room:
            raise MaxModelLenError(f"{name}: {len(ids)} prompt tokens + max_tokens={params.max_tokens} is longer than "
                                   f"max_model_len={self.max_model_len}: room for only {room} new tokens; lower "
                                   f"max_tokens to at most {room}, or " + self._longer_hint())
        probe = Sequence(self._next_id, prompt.main.text, ids, params, encoder_token_ids=enc)
        self.scheduler.check_admissible(probe, name)
        return prompt, ids, enc, params

    def _queue(self, checked) -> int:
        """Queue a checked request: one sequence per completion (SamplingParams.n), ids from the request's own."""
        prompt, ids, enc, params = checked
        rid = self._next_id
        text = prompt.decoder.text if prompt.explicit_pair and prompt.decoder else prompt.main.text
        seqs = [Sequence(rid + i, text, ids, params, encoder_token_ids=enc, default_seed=self.config.seed,
                         index=i, parent_id=rid) for i in range(params.n)]
        for seq in seqs:
            self.scheduler.add(seq)
        self._next_id += params.n
        self._requests[rid] = (prompt, seqs)
        return rid

    def add_request(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue one request (a prompt in any form `generate` takes); return its id. With SamplingParams(n=k) its k
        sequences have ids id, id + 1, ..., id + k - 1 in StepOutput."""
        with self._exclusive():
            return self._queue(self._prepare(parse_prompt(prompt), params, "the request"))

    def abort(self, request_id: int) -> bool:
        """Finish a queued or running request with reason "abort"; False if it is not in flight."""
        check_int("request_id", request_id, low=0)
        with self._exclusive(usable=False):
            return self._abort_request(request_id)

    def _abort_request(self, request_id: int) -> bool:
        seqs = self._requests.pop(request_id, (None, []))[1]
        return any([self.scheduler.abort(s.request_id) is not None for s in seqs])

    def _abort_all(self) -> None:
        for rid in list(self._requests):
            self._abort_request(rid)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def cross_blocks_needed(self, prompts) -> int:
        """Blocks the cross pool must hold to serve all of `prompts` at once."""
        if not self.is_encoder_decoder:
            raise InvalidValueError(f"{self.model_name} has no cross attention")
        bs = self.config.cache.block_size
        return sum(-(-len(self._prompts.encode(p)[1]) // bs) for p in parse_prompts(prompts))

    def step(self, capture: bool = False) -> StepOutput:
        """Run one engine step (a prefill or a decode batch) and say what it did."""
        if not isinstance(capture, bool):
            raise InvalidTypeError(f"capture must be True or False, got {type(capture).__name__} {capture!r}")
        with self._exclusive():
            return self._step(capture)

    def _step(self, capture: bool = False) -> StepOutput:
        batch, is_prefill = self.scheduler.schedule()
        if not batch:
            raise RuntimeError("nothing to run: add_request() first (has_unfinished() is False)")
        try:
            logits, ctx = self.runner.forward(batch, is_prefill, capture=capture)
            snapshot = self._snapshot(batch, is_prefill, ctx)     # host work done while the device runs the step
            try:
                self.runner.check(ctx, logits)
            except KVCacheOverrunError as err:
                self._needs_reset = f"a KV cache overrun was detected at step {ctx.step} ({err})"
                # What the failed step did, up to the guard check: block tables, slots and the layers' events.
                failed = StepOutput(sampled={}, finished=(), trace=StepTrace(
                    events=tuple(ctx.events), scale_fills=tuple(ctx.scale_fills), guard_check="failed"), **snapshot)
                self._abort_all()
                raise err.at_step(failed) from None
            tokens, logprobs = self.runner.sample(logits, batch)
        except BaseException:
            for s in batch:                                     # leave nothing half-done
                self._abort_request(s.parent_id)
            raise
        self.scheduler.postprocess(batch, tokens, logprobs)
        finished = []
        for s in batch:
            if s.finish_reason is None and self._stop_cut(s) is not None:
                self.scheduler.finish(s, "stop")
            group = s.finish_reason is not None and self._requests.get(s.parent_id)
            if group and all(q.finish_reason is not None for q in group[1]):
                finished.append(self._output(s.parent_id))
        trace = StepTrace(events=tuple(ctx.events), scale_fills=tuple(ctx.scale_fills),
                          guard_check="passed" if self.config.sanitize else "off", cuda_graph=ctx.cuda_graph,
                          graph_batch=ctx.graph_batch)
        return StepOutput(sampled={s.request_id: t for s, t in zip(batch, tokens)}, finished=tuple(finished),
                          trace=trace, **snapshot)

    def _snapshot(self, batch, is_prefill: bool, ctx) -> dict:
        """The step's StepOutput fields that must be read before postprocess changes the sequences."""
        bs = self.config.cache.block_size
        slots, cross_slots = {}, {}
        for s in batch:
            first = s.num_cached_tokens if is_prefill else len(s) - 1
            slots[s.request_id] = tuple(slot_of(s.block_table, p, bs) for p in range(first, len(s)))
            if is_prefill and s.encoder_token_ids is not None:
                cross_slots[s.request_id] = tuple(slot_of(s.cross_block_table, p, bs)
                                                  for p in range(len(s.encoder_token_ids)))
        return dict(step=ctx.step, phase="prefill" if is_prefill else "decode",
                    request_ids=tuple(s.request_id for s in batch), seq_lens={s.request_id: len(s) for s in batch},
                    num_cached_tokens={s.request_id: s.num_cached_tokens for s in batch} if is_prefill else {},
                    block_tables={s.request_id: s.table_snapshot() for s in batch}, slot_mapping=slots,
                    cross_block_tables={s.request_id: tuple(s.cross_block_table) for s in batch
                                        if s.encoder_token_ids is not None},
                    cross_slot_mapping=cross_slots)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (a str, {"prompt": str} or {"prompt_token_ids": [...]}, or a list of them);
        outputs come back in the order of `prompts`. `sampling_params`: one for all, one per prompt, or None."""
        return self._generate(parse_prompts(prompts), sampling_params, use_tqdm, "prompts")

    def _generate(self, prompts: list[PromptInput], sampling_params, use_tqdm, what: str) -> list[RequestOutput]:
        check_bool("use_tqdm", use_tqdm)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        elif isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidValueError(f"{len(prompts)} {what} but {len(params)} sampling params: give one "
                                        f"SamplingParams for all, or one per {what[:-1]}")
        else:
            raise InvalidTypeError(f"sampling_params must be a SamplingParams, a list of them, or None; got "
                                   f"{type(sampling_params).__name__}")
        with self._exclusive():
            checked = [self._prepare(p, sp, f"{what}[{i}]") for i, (p, sp) in enumerate(zip(prompts, params))]
            return self._run(checked, use_tqdm) if checked else []

    def _run(self, checked: list, use_tqdm: bool) -> list[RequestOutput]:
        ids = [self._queue(c) for c in checked]
        results: dict[int, RequestOutput] = {}
        # Passing `disable` only when asked keeps tqdm's own TQDM_DISABLE=1 switch working otherwise.
        bar = tqdm(total=len(ids), desc="generate", leave=False, **({} if use_tqdm else {"disable": True}))
        wanted = set(ids)
        try:
            # Library warnings wait for the bar to close (only on the main thread: docs/internals.md).
            hold = not bar.disable and threading.current_thread() is threading.main_thread()
            with held_warnings() if hold else contextlib.nullcontext():
                try:
                    while self.scheduler.has_unfinished():
                        out = self._step()
                        for r in out.finished:
                            if r.request_id in wanted:
                                results[r.request_id] = r
                        bar.update(len(results) - bar.n)
                finally:
                    bar.close()
        except BaseException:
            for rid in ids:                     # leave nothing half-done in the engine
                self._abort_request(rid)
            raise
        return [results[rid] for rid in ids]

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Render `messages` (one conversation of {"role": ..., "content": ...} dicts, or a list of them) with the
        checkpoint's chat template (or `chat_template`), then generate for each, as `generate` does."""
        conversations = chat.check_messages(messages)
        template, specials = chat.load_chat_template(None if self.task is not None else self.model_name)
        template = chat_template if chat_template is not None else template
        if template is None:
            raise chat.no_template_error(self.model_name)
        if not isinstance(template, str):
            raise InvalidTypeError(f"chat_template must be a str (a jinja2 template), got {type(template).__name__}")
        if self.is_encoder_decoder:
            raise InvalidValueError(f"{self.model_name} is an encoder-decoder model: LLM.chat needs a decoder-only "
                                    f"model; call generate")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise InvalidTypeError(f"chat_template_kwargs must be a dict or None, got {chat_template_kwargs!r}")
        prompts = []
        for conv in conversations:
            text = chat.render(template, conv, specials, add_generation_prompt, **(chat_template_kwargs or {}))
            prompts.append(PromptInput(Prompt(text=text, token_ids=tuple(self.tokenizer.encode(text)))))
        return self._generate(prompts, sampling_params, use_tqdm, "conversations")

    def _stop_cut(self, seq: Sequence) -> tuple[int, str] | None:
        """(where the first stop string starts in the generated text, that string), or None when none appears."""
        if not seq.sampling.stop:
            return None
        text = self.tokenizer.decode(seq.output_token_ids)
        found = [(text.find(st), i, st) for i, st in enumerate(seq.sampling.stop) if st in text]
        return min(found)[::2] if found else None

    def _completion(self, seq: Sequence) -> CompletionOutput:
        ids = list(seq.output_token_ids)
        text = self.tokenizer.decode(ids) if seq.sampling.detokenize else ""
        stop_reason = seq.stop_reason
        cut = self._stop_cut(seq)
        if cut is not None:
            # vLLM's rule: the text is cut at the stop string, even inside a token; token_ids keep every token
            at, stop_reason = cut
            text = text[:at + (len(stop_reason) if seq.sampling.include_stop_str_in_output else 0)]
        logprobs = None
        if seq.sampling.logprobs is not None:
            word = self.tokenizer.decode if seq.sampling.detokenize else (lambda ids: None)
            logprobs = [{t: Logprob(lp, rank, word([t])) for t, (lp, rank) in step.items()}
                        for step in seq.logprobs]
        reason = {"eos": "stop"}.get(seq.finish_reason, seq.finish_reason)
        return CompletionOutput(index=seq.index, text=text, token_ids=ids,
                                cumulative_logprob=None if logprobs is None else seq.cumulative_logprob,
                                logprobs=logprobs, finish_reason=reason, stop_reason=stop_reason)

    def _output(self, request_id: int) -> RequestOutput:
        prompt, seqs = self._requests.pop(request_id)
        first = seqs[0]
        completions = [self._completion(s) for s in seqs]
        if not self.is_encoder_decoder:
            return RequestOutput(request_id, prompt.main.text, first.prompt_token_ids, completions, finished=True)
        decoder_text = prompt.decoder.text if prompt.decoder is not None else None
        return RequestOutput(request_id, decoder_text, first.prompt_token_ids, completions, finished=True,
                             encoder_prompt=prompt.main.text, encoder_prompt_token_ids=first.encoder_token_ids)

    def sleep(self, mode: str = "free") -> None:
        """Release the KV cache: "free" drops the arena, "discard" keeps it and drops its contents."""
        check_choice("sleep mode", mode, SLEEP_MODES)
        with self._exclusive(usable=False):
            if self.scheduler.has_unfinished():
                raise RuntimeError("cannot sleep with unfinished requests: let them finish (step()) or abort() them")
            self.runner.sleep(mode)

    def wake_up(self) -> None:
        """Bring the KV cache back, re-initialize it and warm up again."""
        with self._exclusive(usable=False):
            if self.runner.asleep:
                self.runner.wake_up()
                self._build_scheduler()
                self._needs_reset = None

    def reset(self) -> None:
        """Abort every request in flight and replace the KV arena with a fresh one."""
        with self._exclusive(usable=False):
            self._abort_all()
            self.runner.sleep()
            self.runner.wake_up()
            self._build_scheduler()
            self._needs_reset = None

    @property
    def arena(self):
        return self.runner.arena

    @property
    def census(self):
        """The scale-fill census of this engine (defect A instrumentation)."""
        return self.runner.census

    # ---- inspection: what the notebooks and tests look at, besides StepOutput ---------------------------------
    @property
    def attention_layers(self) -> dict:
        """Every attention layer by name, in model order, as the engine bound it (read only)."""
        return dict(self.runner.bindings)

    @property
    def kv_layout(self):
        """The `KVLayout` of the first self-attention pool."""
        return self.runner.layout

    @property
    def kv_layouts(self) -> dict:
        """Every arena pool's `KVLayout`, as allocated, by pool name."""
        return dict(self.runner.layouts)

    @property
    def kernel_ops(self):
        """The kernels this engine runs (Triton, or their PyTorch references with backend="torch")."""
        return self.runner.ops

    @property
    def model(self):
        """The loaded model (a torch module; its attention ops are the values of `attention_layers`)."""
        return self.runner.model

    @property
    def model_config(self):
        """The loaded model's configuration."""
        return self.runner.model.config

