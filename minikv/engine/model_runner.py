"""ModelRunner: owns the model, the KV arena and the attention impls; turns a scheduled batch into tokens.

Lifecycle (the shape of the real engines):
  1. build one attention impl per paged attention layer (the cross layers' layouts come from CrossBackendBuilder);
  2. allocate the KV arena: one pool per KV-owning self-attention layer and one cross pool per cross layer, each
     with the layout of its own layer (head size and KV heads may differ by layer, as Gemma-4's sliding and
     full layers do); a KV-sharing layer addresses its source's pool with its source's layout;
  3. bind caches: each layer gets its pool's tensor, and a KV-sharing layer gets *the same tensor object* as its
     target layer;
  4. warmup, in one of two shapes (`warmup=`):
     "dummy" (default, upstream's): one forward without attention metadata; owning layers run their cache update
       with slot -1 (nothing is written), sharing layers are not touched at all;
     "capture": one decode-shaped forward *with* attention metadata through every layer (minikv's model of a
       CUDA-graph capture run; upstream does not name its warmup shapes), all slots -1, dummy sequences of length
       1 on block 0, so every impl is touched before any real step;
  then `execute(seqs, is_prefill)` per step.
`sleep(mode)`: "discard" keeps the arena's storage and address and discards the pools' contents (zeroed here):
minikv's model of a sleep that wakes up at the same address, which upstream's text neither states nor excludes; "free" drops the arena and `wake_up()` allocates a new one. `wake_up()` binds the
caches and warms up again; in the fixed engine every scale region is initialized again, in both modes.
"""
from __future__ import annotations

import math

import torch

from minikv.attention.backend import get_ops
from minikv.attention.context import ForwardContext, set_forward_context
from minikv.attention.cross import CrossAttentionImpl, CrossBackendBuilder
from minikv.attention.impl import AttentionImpl, ScaleFillCensus, release_scale_init
from minikv.attention.metadata import AttentionMetadata, CrossMetadata
from minikv.cache.arena import KVArena, PoolSpec
from minikv.cache.blocks import slot_of
from minikv.cache.layout import KVLayout
from minikv.config import EngineConfig

WARMUP_SHAPES = ("dummy", "capture")
SLEEP_MODES = ("free", "discard")


def _available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class ModelRunner:
    def __init__(self, config: EngineConfig, model, *, pad_id: int = 0, cross_context_path: str = "fused",
                 paged_context: bool = False, cross_construction: str = "eager", warmup: str = "dummy"):
        if warmup not in WARMUP_SHAPES:
            raise ValueError(f"warmup must be one of {WARMUP_SHAPES}, got {warmup!r}")
        self.config = config
        self.warmup_shape = warmup
        self.asleep = False
        # What the fixed engine does at sleep(): forget that the pools' scale regions were initialized, so the
        # warmup after wake_up() fills them again. False models a registry keyed by (data_ptr, nbytes) alone,
        # which cannot tell a same-address wake from no sleep at all (the repro's "nothing re-initializes").
        self.reinit_scales_on_wake = True
        self.pad_id = pad_id
        self.model = model
        self.device, self.dtype = config.device, config.dtype
        self.block_size = config.cache.block_size
        self.ops = get_ops(config.backend)
        self.census = ScaleFillCensus()
        self.step = 0
        mc = model.config
        layers = model.attention_layers()
        self.self_layers = [a for a in layers if a.kind == "self"]
        self.cross_layers = [a for a in layers if a.kind == "cross"]
        self.by_name = {a.layer_name: a for a in layers}
        # The layouts the cache manager allocates the pools with (pool name -> KVLayout): the engine's own cache
        # config at each layer's head size and KV-head count.
        self.layouts: dict[str, KVLayout] = {}
        for a in self.cross_layers:
            self.layouts[f"cross.{a.layer_name}"] = self._layout_of(a)
        for a in self.self_layers:
            if a.kv_sharing_target is None:
                self.layouts[f"kv.{a.layer_name}"] = self._layout_of(a)
        for a in self.self_layers:
            if a.kv_sharing_target is not None:
                self._check_sharing_shape(a)
        # `layout`: the layout of the first self-attention pool (the cross pool's for a model without one); on a
        # model with one layout everywhere it is every pool's. Per-pool: `layouts`.
        self.layout = next((self.layouts[f"kv.{a.layer_name}"] for a in self.self_layers
                            if a.kv_sharing_target is None), None) or next(iter(self.layouts.values()))
        per_seq = math.ceil(mc.max_position / self.block_size)
        self.num_blocks = config.cache.num_blocks or config.scheduler.max_num_seqs * per_seq
        per_enc = math.ceil(max(mc.max_encoder_len, 1) / self.block_size)
        self.num_cross_blocks = (config.cache.cross_pool_blocks or config.scheduler.max_num_seqs * per_enc
                                 if self.cross_layers else 0)

        bugs = config.reintroduce
        for a in self.self_layers:
            a.impl = AttentionImpl(a.layer_name, a.num_heads, self.layouts[self.pool_name(a)], self.ops,
                                   kv_sharing_target=a.kv_sharing_target,
                                   historical_scale_init="scale-wipe" in bugs, census=self.census,
                                   sliding_window=a.sliding_window, sm_scale=a.sm_scale,
                                   rel_bias=a.rel_bias)
        builder = CrossBackendBuilder(config.cache.kv_cache_dtype, self.dtype, self.block_size,
                                      historical="cross-stride" in bugs,
                                      kv_scale_placement=config.cache.kv_scale_placement)
        for a in self.cross_layers:
            a.impl = CrossAttentionImpl(a.layer_name, a.num_heads,
                                        builder.build(cross_construction, a.num_kv_heads, a.head_size), self.ops,
                                        context_path=cross_context_path, paged_context=paged_context,
                                        historical_context_read="cross-fp8-context-read" in bugs,
                                        sm_scale=a.sm_scale)
        self.arena: KVArena | None = None
        self._pool_owners: dict = {}
        self.last_context: ForwardContext | None = None
        self.check_memory()
        self.wake_up()

    def _layout_of(self, a) -> KVLayout:
        """The layout the allocator gives layer `a`'s pool: the engine's cache config at the layer's own shape."""
        cache = self.config.cache
        try:
            return KVLayout(cache.kv_cache_dtype, self.dtype, a.num_kv_heads, a.head_size, self.block_size,
                            cache.kv_scale_placement)
        except ValueError as e:
            raise ValueError(f"{a.layer_name}: cannot allocate its KV pool ({a.num_kv_heads} KV heads of size "
                             f"{a.head_size}): {e}") from e

    def _check_sharing_shape(self, a) -> None:
        """A KV-sharing layer reads its source's pool, so it must have the source's head size and KV heads."""
        source = self.by_name[a.kv_sharing_target]
        if (a.num_kv_heads, a.head_size) != (source.num_kv_heads, source.head_size):
            raise ValueError(f"{a.layer_name} shares the KV cache of {source.layer_name}, but has "
                             f"{a.num_kv_heads} KV heads of size {a.head_size} where its source has "
                             f"{source.num_kv_heads} of size {source.head_size}; a sharing layer must match "
                             f"the shape of the cache it reads")

    def pool_name(self, a) -> str:
        """The arena pool layer `a` reads: its own, or its KV-sharing source's."""
        if a.kind == "cross":
            return f"cross.{a.layer_name}"
        return f"kv.{a.kv_sharing_target or a.layer_name}"

    def check_memory(self) -> None:
        """Refuse, before allocating, an arena larger than the memory the device has free."""
        need = sum(s.nbytes for s in self.pool_specs())
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
        else:
            free = _available_host_bytes()
        if free is not None and need > free:
            raise MemoryError(f"the KV cache would need {need / 2**30:.1f} GiB but only {free / 2**30:.1f} GiB "
                              f"is free on {self.device}; lower num_blocks, cross_pool_blocks or max_num_seqs")

    # ---- the arena ------------------------------------------------------------------------------------------
    def pool_specs(self) -> list[PoolSpec]:
        # Cross pools first: an overrun past one of them lands in a guard zone, then on a live pool.
        specs = [PoolSpec(name, self.layouts[name], self.num_cross_blocks) for name in
                 (f"cross.{a.layer_name}" for a in self.cross_layers)]
        specs += [PoolSpec(name, self.layouts[name], self.num_blocks) for name in
                  (f"kv.{a.layer_name}" for a in self.self_layers if a.kv_sharing_target is None)]
        return specs

    def _bind_caches(self) -> None:
        check = self.config.check_layout
        self._pool_owners = {f"kv.{a.layer_name}": a for a in self.self_layers if a.kv_sharing_target is None}
        self._pool_owners.update({f"cross.{a.layer_name}": a for a in self.cross_layers})
        for a in self.self_layers:
            if a.kv_sharing_target is None:
                a.kv_cache = self.arena.bind(f"kv.{a.layer_name}", a.impl.layout, check=check)
        for a in self.self_layers:
            if a.kv_sharing_target is not None:
                target = self.by_name[a.kv_sharing_target]
                a.kv_cache = target.kv_cache             # the same tensor object, not a copy or a new view
        for a in self.cross_layers:
            a.kv_cache = self.arena.bind(f"cross.{a.layer_name}", a.impl.layout, check=check)

    def _owning_pools(self) -> list[torch.Tensor]:
        return [a.kv_cache for a in self.self_layers if a.kv_sharing_target is None and a.kv_cache is not None]

    def wake_up(self) -> None:
        """Bring the arena back (a fresh one after sleep("free")), bind every layer's cache, run the warmup."""
        if self.arena is not None and not self.asleep:
            return
        if self.arena is None:
            self.arena = KVArena(self.pool_specs(), self.device, reach_elem_bytes=self.dtype.itemsize)
        self._bind_caches()
        self.asleep = False
        self.warmup()

    def sleep(self, mode: str = "free") -> None:
        """Release the KV cache's contents: "discard" keeps the storage at its address, "free" drops it."""
        if mode not in SLEEP_MODES:
            raise ValueError(f"sleep mode must be one of {SLEEP_MODES}, got {mode!r}")
        if self.arena is None or self.asleep:
            return
        historical = "scale-wipe" in self.config.reintroduce
        if not historical and self.reinit_scales_on_wake:
            for pool in self._owning_pools():
                release_scale_init(pool)         # FIX (scale-wipe): the contents go, so does "initialized"
        for a in self.self_layers + self.cross_layers:
            if isinstance(a.impl, AttentionImpl) and not historical:
                a.impl.forget_storage()
        if mode == "discard":
            # A same-address sleep (minikv's model): the memory behind the addresses is released and mapped again;
            # minikv zeroes the pools (not the guard zones) to stand for "contents discarded".
            for name in self.arena.specs:
                self.arena.pool(name).zero_()
        else:
            for a in self.self_layers + self.cross_layers:
                a.kv_cache = None
            self.arena.free()
            self.arena = None
        self.asleep = True

    # ---- warmup -----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def warmup(self, num_tokens: int = 16) -> None:
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        md = None if self.warmup_shape == "dummy" else self._capture_metadata(num_tokens)
        if md is None:
            pos = torch.arange(num_tokens, device=self.device)
        with set_forward_context(ForwardContext(attn_metadata=md, step=-1)):
            if self.cross_layers:
                enc = torch.zeros(num_tokens, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
                self.model(ids, pos, encoder_out=enc if md is None else None)
            else:
                self.model(ids, pos)

    def _capture_metadata(self, num_seqs: int) -> AttentionMetadata:
        """A decode batch of `num_seqs` dummy sequences of length 1 on block 0, writing nothing (slot -1)."""
        ones = self._tensor([1] * num_seqs)
        md = AttentionMetadata(is_prefill=False, slot_mapping=self._tensor([-1] * num_seqs, torch.int64),
                               query_start_loc=self._tensor(list(range(num_seqs + 1))), seq_lens=ones,
                               block_tables=self._tensor([[0]] * num_seqs), max_query_len=1, max_seq_len=1)
        if self.cross_layers:
            md.cross = CrossMetadata(encoder_seq_lens=ones, block_tables=self._tensor([[0]] * num_seqs))
        return md

    # ---- one step ---------------------------------------------------------------------------------------------
    def _tensor(self, data, dtype=torch.int32):
        return torch.tensor(data, dtype=dtype, device=self.device)

    def _block_table_tensor(self, tables: list[list[int]]) -> torch.Tensor:
        width = max(1, max(len(t) for t in tables))
        return self._tensor([t + [0] * (width - len(t)) for t in tables])

    def prepare(self, seqs, is_prefill: bool):
        bs = self.block_size
        input_ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for s in seqs:
            first = s.num_cached_tokens if is_prefill else len(s) - 1
            for p in range(first, len(s)):
                input_ids.append(s.token_ids[p])
                positions.append(p)
                slots.append(slot_of(s.block_table, p, bs))
            starts.append(len(input_ids))
            seq_lens.append(len(s))
        md = AttentionMetadata(
            is_prefill=is_prefill,
            slot_mapping=self._tensor(slots, torch.int64),
            query_start_loc=self._tensor(starts),
            seq_lens=self._tensor(seq_lens),
            block_tables=self._block_table_tensor([s.block_table for s in seqs]),
            max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
            max_seq_len=max(seq_lens),
        )
        encoder_out = None
        if self.cross_layers:
            md.cross, encoder_out = self._prepare_cross(seqs, is_prefill)
        return (self._tensor(input_ids, torch.long), self._tensor(positions, torch.long), md, encoder_out)

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
    def execute(self, seqs, is_prefill: bool, capture: bool = False) -> tuple[list[int], ForwardContext]:
        """Run one forward step for `seqs`; return one sampled token per sequence and the step's context.

        The context carries the step's metadata and its trace of cache events (`ForwardContext.events`).
        With sanitize on, raises KVCacheOverrunError when a guard zone was written, and FloatingPointError, naming
        the step and the first layer whose attention output was not finite, when the logits hold NaN or inf.
        """
        if self.arena is None or self.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        input_ids, positions, md, encoder_out = self.prepare(seqs, is_prefill)
        ctx = ForwardContext(attn_metadata=md, step=self.step, pool_names=self.pool_names, capture=capture)
        self.last_context = ctx          # kept for a step that raises (LLM attaches its partial trace to the error)
        with set_forward_context(ctx):
            if self.cross_layers:
                hidden = self.model(input_ids, positions, encoder_out=encoder_out)
            else:
                hidden = self.model(input_ids, positions)
        self.step += 1
        last = md.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last])
        if self.config.sanitize:
            self.arena.check()
        # Part of the sanitizer: with sanitize=False a defect runs silently (as upstream), NaN logits included.
        if self.config.sanitize and not bool(torch.isfinite(logits).all()):
            layer = ctx.first_non_finite_layer()
            where = (f"the first non-finite attention output was in layer {layer!r}" if layer else
                     "every attention output was finite, so it arose after attention (MLP, norm or LM head)")
            raise FloatingPointError(f"step {ctx.step}: the logits hold NaN or inf; {where}. Check the model's "
                                     f"weights and the KV cache (sanitize=True checks the arena's guards)")
        return self.sample(logits, seqs), ctx

    @property
    def pool_names(self) -> dict[int, str]:
        """Arena pool name of every bound cache tensor, keyed by id(tensor) (KV-sharing layers share an entry)."""
        return {id(a.kv_cache): name for name, a in self._pool_owners.items() if a.kv_cache is not None}

    @staticmethod
    def sample(logits: torch.Tensor, seqs) -> list[int]:
        greedy = logits.argmax(dim=-1).tolist()
        out = []
        for row, s, g in zip(logits, seqs, greedy):
            t = s.sampling.temperature
            if t == 0:
                out.append(g)
                continue
            probs = torch.softmax(row.float().cpu() / t, dim=-1)
            out.append(int(torch.multinomial(probs, 1, generator=s.generator)))
        return out
