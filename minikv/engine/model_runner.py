"""ModelRunner: owns the model, the KV arena and the attention impls; turns a scheduled batch into tokens.
See docs/internals.md#engine-model-runner."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from minikv.attention.backend import get_ops
from minikv.attention.binding import LayerBinding, pool_name
from minikv.attention.context import ForwardContext
from minikv.attention.cross import CrossAttentionImpl, CrossBackendBuilder
from minikv.attention.impl import AttentionImpl, ScaleFillCensus, release_scale_init
from minikv.attention.metadata import AttentionMetadata, CrossMetadata
from minikv.cache.arena import KVArena, PoolSpec, SeparateKVArena
from minikv.cache.blocks import slot_of
from minikv.cache.layout import KVLayout
from minikv.config import EngineConfig
from minikv.engine import sampler
from minikv.engine import memory
from minikv.engine.cuda_graph import DecodeGraphs

class ModelRunner:
    """Turns a scheduled batch into one sampled token per sequence, through the model and the KV arena."""

    def __init__(self, config: EngineConfig, model, *, pad_id: int = 0):
        self.config = config
        self.asleep = False
        self.pad_id = pad_id
        self.model = model
        self.device, self.dtype = config.device, config.dtype
        self.block_size = config.cache.block_size
        self.ops = get_ops(config.backend)
        self.census = ScaleFillCensus()
        self.step = 0
        self.bindings: dict[str, LayerBinding] = self._build_bindings(model.attention_layers())
        # Pool name -> KVLayout, in arena order: cross pools first (an overrun past one lands on a live pool).
        owners = [b for b in self.bindings.values() if b.owns_pool]
        self.layouts: dict[str, KVLayout] = {b.pool: b.layout for b in sorted(owners, key=lambda b: b.kind != "cross")}
        # the first self-attention pool's layout (the cross pool's for a model without one)
        self.layout = next((b.layout for b in owners if b.kind == "self"), owners[0].layout)
        self.size = self._size_cache()
        self.num_blocks, self.num_cross_blocks = self.size.num_blocks, self.size.num_cross_blocks
        self.max_model_len = self.size.max_model_len
        per_seq = math.ceil(self.max_model_len / self.block_size)
        per_enc = math.ceil(max(model.config.max_encoder_len, 1) / self.block_size)
        has_cross = any(b.kind == "cross" for b in owners)
        # CUDA-graph decode: the self pools get one block more, for the padding rows of a graph's batch
        self.graphs = (DecodeGraphs(config.scheduler.max_num_seqs, per_seq, self.block_size, self.num_blocks,
                                    self.device, per_enc if has_cross else 0, config.sanitize)
                       if config.cuda_graphs else None)
        self.arena: KVArena | None = None
        self.check_memory()
        self.wake_up()

    def _build_bindings(self, ops) -> dict[str, LayerBinding]:
        """One LayerBinding per attention op, in model order: its pool, that pool's layout, its impl."""
        config, by_name = self.config, {op.layer_name: op for op in ops}
        bugs, repro = config.reintroduce, config.repro
        builder = CrossBackendBuilder(config.cache.kv_cache_dtype, self.dtype, self.block_size,
                                      historical="cross-stride" in bugs,
                                      kv_scale_placement=config.cache.kv_scale_placement)
        bindings: dict[str, LayerBinding] = {}
        for op in ops:
            owner = op.kv_sharing_target or op.layer_name
            if owner != op.layer_name:
                self._check_sharing_shape(op, by_name[owner])
                layout = bindings[owner].layout         # a KV-sharing layer addresses its source's pool
            else:
                layout = self._layout_of(op)
            if op.kind == "cross":
                backend_layout = builder.build(repro.cross_construction, op.num_kv_heads, op.head_size)
                impl = CrossAttentionImpl(op.layer_name, op.num_heads, backend_layout, self.ops, sm_scale=op.sm_scale,
                                          context_path=repro.cross_context_path, paged_context=repro.paged_context,
                                          historical_context_read="cross-fp8-context-read" in bugs)
            else:
                impl = AttentionImpl(op.layer_name, op.num_heads, layout, self.ops,
                                     kv_sharing_target=op.kv_sharing_target,
                                     historical_scale_init="scale-wipe" in bugs, census=self.census,
                                     sliding_window=op.sliding_window, sm_scale=op.sm_scale)
            bindings[op.layer_name] = LayerBinding(op.layer_name, op.kind, op.kv_sharing_target, owner,
                                                   pool_name(op.kind, owner), layout, impl, op)
        return bindings

    def _layout_of(self, op) -> KVLayout:
        """The layout the allocator gives layer `op`'s pool: the engine's cache config at the layer's own shape."""
        cache = self.config.cache
        try:
            return KVLayout(cache.kv_cache_dtype, self.dtype, op.num_kv_heads, op.head_size, self.block_size,
                            cache.kv_scale_placement)
        except ValueError as e:
            raise ValueError(f"{op.layer_name}: cannot allocate its KV pool ({op.num_kv_heads} KV heads of size "
                             f"{op.head_size}): {e}; run the model in dense mode instead") from e

    @staticmethod
    def _check_sharing_shape(op, source) -> None:
        if (op.num_kv_heads, op.head_size) != (source.num_kv_heads, source.head_size):
            raise ValueError(f"{op.layer_name} shares the KV cache of {source.layer_name}, but has "
                             f"{op.num_kv_heads} KV heads of size {op.head_size} where its source has "
                             f"{source.num_kv_heads} of size {source.head_size}; a sharing layer must match "
                             f"the shape of the cache it reads")

    def _size_cache(self) -> memory.CacheSize:
        cache, sched, mc = self.config.cache, self.config.scheduler, self.model.config
        self_bytes = sum(lay.block_bytes for n, lay in self.layouts.items() if not n.startswith("cross."))
        cross_bytes = sum(lay.block_bytes for n, lay in self.layouts.items() if n.startswith("cross."))
        budget, source = cache.kv_cache_memory_bytes, f"kv_cache_memory_bytes={cache.kv_cache_memory_bytes}"
        if budget is None and cache.num_blocks is None:
            if self.device.type == "cuda":
                budget = memory.cuda_budget(self.device, cache.gpu_memory_utilization,
                                            memory.profile_activations(self.model, self.device, sched))
                source = f"gpu_memory_utilization={cache.gpu_memory_utilization}"
            else:
                budget, source = memory.DEFAULT_CPU_KV_CACHE_BYTES, "the CPU default budget"
        if budget is not None and self.config.cuda_graphs:
            budget -= self_bytes                # the padding block of CUDA-graph batches
        return memory.size_cache(block_bytes=self_bytes, cross_block_bytes=cross_bytes, block_size=self.block_size,
                                 max_num_seqs=sched.max_num_seqs, config_len=mc.max_position,
                                 encoder_len=mc.max_encoder_len, num_blocks=cache.num_blocks,
                                 cross_pool_blocks=cache.cross_pool_blocks, max_model_len=sched.max_model_len,
                                 budget_bytes=budget, budget_source=source)

    def check_memory(self) -> None:
        """Refuse, before allocating, an arena larger than the memory the device has free, naming what sized it."""
        need = sum(s.nbytes for s in self.pool_specs())
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else memory.available_host_bytes()
        if free is not None and need > free:
            cross = ", cross_pool_blocks" if self.num_cross_blocks else ""
            if self.config.cache.num_blocks is not None:
                fix = f"lower num_blocks (--num-blocks){cross}"
            else:
                fix = (f"lower kv_cache_memory_bytes (--kv-cache-memory-bytes), max_model_len (--max-model-len) or "
                       f"max_num_seqs (--max-num-seqs){cross}")
            raise MemoryError(f"the KV cache would need {need / 2**30:.2f} GiB ({self.size.budget_source}: "
                              f"{self.num_blocks} blocks of {self.block_size} tokens) but only {free / 2**30:.2f} "
                              f"GiB is free on {self.device}; {fix}")

    def pool_specs(self) -> list[PoolSpec]:
        padding = 1 if self.graphs is not None else 0
        return [PoolSpec(n, lay, self.num_cross_blocks if n.startswith("cross.") else self.num_blocks + padding)
                for n, lay in self.layouts.items()]

    def _bind_caches(self) -> None:
        """Hand every layer its pool's tensor (a KV-sharing layer its owner's very tensor)."""
        for b in self.bindings.values():
            if b.owns_pool:
                b.kv_cache = self.arena.bind(b.pool, b.impl.layout, check=self.config.repro.check_layout)
        for b in self.bindings.values():
            if not b.owns_pool:
                b.kv_cache = self.bindings[b.owner].kv_cache   # the same tensor object, not a copy or a new view

    def wake_up(self) -> None:
        """Bring the arena back (a fresh one after sleep("free")), bind every layer's cache, run the warmup."""
        if self.arena is not None and not self.asleep:
            return
        if self.arena is None:
            arena = SeparateKVArena if self.config.repro.kv_arena == "per-pool" else KVArena
            self.arena = arena(self.pool_specs(), self.device, reach_elem_bytes=self.dtype.itemsize)
        self._bind_caches()
        self.asleep = False
        self.warmup()

    def sleep(self, mode: str = "free") -> None:
        """Release the KV cache's contents: "discard" keeps the storage at its address, "free" drops it."""
        if self.arena is None:
            return                               # already freed
        if self.graphs is not None:
            self.graphs.clear()                  # graphs hold the pools' addresses: captured again after wake-up
        if self.asleep:
            if mode == "free":                   # discarded earlier; now the storage goes too
                self._free_arena()
            return
        historical = "scale-wipe" in self.config.reintroduce
        if not historical and self.config.repro.reinit_scales_on_wake:
            for b in self.bindings.values():
                if b.owns_pool and b.kind == "self":
                    release_scale_init(b.kv_cache)     # FIX (scale-wipe): the contents go, so does "initialized"
        if not historical:
            for b in self.bindings.values():
                if isinstance(b.impl, AttentionImpl):
                    b.impl.forget_storage()
        if mode == "discard":
            # a same-address sleep: zeroed pools (not the guard zones) stand for "contents discarded"
            for name in self.arena.specs:
                self.arena.pool(name).zero_()
        else:
            self._free_arena()
        self.asleep = True

    def _free_arena(self) -> None:
        for b in self.bindings.values():
            b.kv_cache = None
        self.arena.free()
        self.arena = None

    def _forward(self, input_ids, positions, ctx: ForwardContext, encoder_out=None) -> torch.Tensor:
        """The model's forward pass in engine mode: `ctx` goes down the call to every attention op."""
        if self.model.config.is_encoder_decoder:
            return self.model(input_ids, positions, encoder_out, ctx=ctx)
        return self.model(input_ids, positions, ctx=ctx)

    @torch.inference_mode()
    def warmup(self, num_tokens: int = 16) -> None:
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        md = None if self.config.repro.warmup == "dummy" else self._capture_metadata(num_tokens)
        pos = torch.arange(num_tokens, device=self.device) if md is None else torch.zeros_like(ids)
        enc = None
        if self.model.config.is_encoder_decoder and md is None:
            enc = torch.zeros(num_tokens, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
        self._forward(ids, pos, ForwardContext(attn_metadata=md, bindings=self.bindings, step=-1), enc)

    def _capture_metadata(self, num_seqs: int) -> AttentionMetadata:
        """A decode batch of `num_seqs` dummy sequences of length 1 on block 0, writing nothing (slot -1)."""
        ones = self._tensor([1] * num_seqs)
        md = AttentionMetadata(is_prefill=False, slot_mapping=self._tensor([-1] * num_seqs, torch.int64),
                               query_start_loc=self._tensor(list(range(num_seqs + 1))), seq_lens=ones,
                               block_tables=self._tensor([[0]] * num_seqs), max_query_len=1, max_seq_len=1)
        if self.model.config.is_encoder_decoder:
            md.cross = CrossMetadata(encoder_seq_lens=ones, block_tables=self._tensor([[0]] * num_seqs))
        return md

    def _tensor(self, data, dtype=torch.int32):
        return torch.tensor(data, dtype=dtype, device=self.device)

    def _block_table_tensor(self, tables: list[list[int]]) -> torch.Tensor:
        width = max(1, max(len(t) for t in tables))
        return self._tensor([t + [0] * (width - len(t)) for t in tables])

    def prepare(self, seqs, is_prefill: bool):
        bs, input_ids, positions, slots, starts, seq_lens = self.block_size, [], [], [], [0], []
        for s in seqs:               # array operations per sequence: a prefill step holds thousands of tokens
            first = s.num_cached_tokens if is_prefill else len(s) - 1
            input_ids += s.token_ids[first:]
            positions.append(np.arange(first, len(s), dtype=np.int64))
            slots.append(slot_of(np.asarray(s.block_table, dtype=np.int64), positions[-1], bs))
            starts.append(len(input_ids))
            seq_lens.append(len(s))
        slots, positions = (torch.from_numpy(np.concatenate(a)).to(self.device) for a in (slots, positions))
        md = AttentionMetadata(is_prefill=is_prefill, slot_mapping=slots,
                               query_start_loc=self._tensor(starts), seq_lens=self._tensor(seq_lens),
                               block_tables=self._block_table_tensor([s.block_table for s in seqs]),
                               max_query_len=max(b - a for a, b in zip(starts, starts[1:])), max_seq_len=max(seq_lens))
        encoder_out = None
        if self.model.config.is_encoder_decoder:
            md.cross, encoder_out = self._prepare_cross(seqs, is_prefill)
        return self._tensor(input_ids, torch.long), positions, md, encoder_out

    def _prepare_cross(self, seqs, is_prefill: bool):
        bs = self.block_size
        enc_lens = [len(s.encoder_token_ids) for s in seqs]
        cm = CrossMetadata(encoder_seq_lens=self._tensor(enc_lens),
                           block_tables=self._block_table_tensor([s.cross_block_table for s in seqs]))
        if not is_prefill:
            return cm, None
        starts, slots = [0], []
        for s, n in zip(seqs, enc_lens):
            slots += [slot_of(s.cross_block_table, p, bs) for p in range(n)]
            starts.append(starts[-1] + n)
        cm.encoder_start_loc, cm.slot_mapping = self._tensor(starts), self._tensor(slots, torch.int64)
        # The encoder is dense and unpaged: run it on the padded batch, then keep only the real rows.
        width = max(enc_lens)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(seqs), width, dtype=torch.bool, device=self.device)
        for i, s in enumerate(seqs):
            ids[i, : enc_lens[i]] = self._tensor(s.encoder_token_ids, torch.long)
            mask[i, : enc_lens[i]] = True
        enc = self.model.encode(ids, mask)
        return cm, enc[mask]

    @torch.inference_mode()
    def forward(self, seqs, is_prefill: bool, capture: bool = False) -> tuple[torch.Tensor, ForwardContext]:
        """Run one forward step for `seqs`; return the last tokens' logits and the step's context."""
        if self.arena is None or self.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        if self.graphs is not None and not is_prefill and not capture and self.graphs.fits(seqs):
            ctx, logits = self.graphs.decode(seqs, self.bindings, self.step, self._decode_logits)
            self.step += 1
            return logits, ctx
        input_ids, positions, md, encoder_out = self.prepare(seqs, is_prefill)
        ctx = ForwardContext(attn_metadata=md, bindings=self.bindings, step=self.step, capture=capture,
                             watch_finite=self.config.sanitize)
        last = md.query_start_loc[1:].long() - 1
        fast = self.config.cache.kv_sharing_fast_prefill and getattr(self.model.config, "num_kv_shared_layers", 0)
        if is_prefill and fast:
            # the KV-sharing layers attend as a decode step of each sequence's last token (minikv/models/gemma4.py)
            ctx.shared_rows, ctx.shared_metadata = last, dataclasses.replace(
                md, is_prefill=False, slot_mapping=md.slot_mapping[last], max_query_len=1,
                query_start_loc=torch.arange(md.num_seqs + 1, dtype=torch.int32, device=self.device))
        hidden = self._forward(input_ids, positions, ctx, encoder_out)
        self.step += 1
        return self.model.compute_logits(hidden if ctx.rows_kept else hidden[last]), ctx

    def check(self, ctx: ForwardContext, logits: torch.Tensor) -> None:
        """With sanitize on: raise when a guard zone was written or the logits hold NaN or inf."""
        if not self.config.sanitize:
            return
        self.arena.check()
        if not bool(torch.isfinite(logits).all()):
            layer = ctx.first_non_finite_layer()
            where = (f"the first non-finite attention output was in layer {layer!r}" if layer else
                     "every attention output was finite, so it arose after attention (MLP, norm or LM head)")
            raise FloatingPointError(f"step {ctx.step}: the logits hold NaN or inf; {where}. Check the model's "
                                     f"weights and the KV cache (sanitize=True checks the arena's guards)")

    def _decode_logits(self, input_ids, positions, ctx: ForwardContext) -> torch.Tensor:
        """A decode forward (one token per sequence) and the LM head: what a decode graph captures."""
        return self.model.compute_logits(self._forward(input_ids, positions, ctx))

    @staticmethod
    def sample(logits: torch.Tensor, seqs) -> tuple[list[int], list | None]:
        """One token per sequence (and its logprobs entry), by `minikv.engine.sampler`: the hunter's seam."""
        return sampler.sample(logits, seqs)
