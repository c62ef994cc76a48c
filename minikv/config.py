"""Configuration objects: how the KV cache is laid out, how requests are scheduled, what an engine is built from.
See docs/internals.md#config."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minikv.defects import registry
from minikv.kernels.errors import InvalidTypeError, InvalidValueError
from minikv.kernels.formats import (  # noqa: F401  (re-exported)
    BLOCK_SIZES,
    KV_CACHE_DTYPES,
    check_block_size,
    check_kv_cache_dtype,
    check_scale_placement,
)

if TYPE_CHECKING:                       # the model configs live with their models
    from minikv.models.gemma4_config import Gemma4Config
    from minikv.models.t5 import T5Config

# The choices of the engine's string options (the one list of each).
BACKENDS = ("triton", "torch")                    # the Triton kernels, or their pure-PyTorch references
WARMUP_SHAPES = ("dummy", "capture")              # minikv.engine.model_runner: how the engine warms up
CROSS_CONTEXT_PATHS = ("fused", "fallback")       # minikv.attention.cross: the cross context step (defect B2)
CONSTRUCTION_ORDERS = ("eager", "deferred")       # minikv.attention.cross: how a cross layer gets its backend (B1)
SLEEP_MODES = ("free", "discard")                 # LLM.sleep(mode)
ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_SEED = 2**63 - 1
KV_ARENAS = ("one", "per-pool")                  # minikv.cache.arena: KVArena, SeparateKVArena


def check_int(name: str, value, low: int = 1, high: int | None = None, allow_none: bool = False) -> None:
    """Raise TypeError unless `value` is an int (not a bool), ValueError unless low <= value <= high."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an int or None" if allow_none else "an int"
        raise InvalidTypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidValueError(f"{name} must be {bound}, got {value}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_backend(backend) -> None:
    """A backend is minikv's ("triton", "torch"), an adapter's name (minikv.attention.backends.NAMES), or an object
    with the engine's four calls (minikv.attention.protocol.AttentionBackend)."""
    from minikv.attention import backends
    from minikv.attention.protocol import AttentionBackend
    if isinstance(backend, str):
        check_choice("backend", backend, BACKENDS + backends.NAMES)
    elif not isinstance(backend, AttentionBackend):
        raise InvalidTypeError(f"backend must be a name ({', '.join(BACKENDS + backends.NAMES)}) or an object with "
                               f"name, write_kv, decode, context and paged_context (minikv.attention.protocol."
                               f"AttentionBackend), got {type(backend).__name__}")


def check_choice(name: str, value, choices) -> None:
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a str, one of {', '.join(choices)}; got {type(value).__name__} {value!r}")
    if value not in choices:
        raise InvalidValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def resolve_device(device) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N' (or a torch.device) as a torch.device, refusing what this machine lacks."""
    if not isinstance(device, (str, torch.device)):
        raise InvalidTypeError(f"device must be a str such as 'cpu' or 'cuda:0', got {type(device).__name__} {device!r}")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise InvalidValueError(f"device {device!r} is not a device string; use 'cpu', 'cuda' or 'cuda:N'") from err
    if resolved.type not in ("cpu", "cuda"):
        raise InvalidValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(device)!r}")
    if resolved.type == "cpu" and resolved.index not in (None, 0):
        raise InvalidValueError(f"device {str(device)!r}: there is one CPU device; use 'cpu'")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidValueError(f"device {str(device)!r} but no CUDA device is available; use device='cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise InvalidValueError(f"device {str(device)!r} does not exist: {torch.cuda.device_count()} CUDA device(s) "
                                    f"visible")
    return resolved


@dataclass(frozen=True)
class CacheConfig:
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None          # None: sized automatically
    cross_pool_blocks: int | None = None   # encoder-decoder only; None: sized automatically
    enable_prefix_caching: bool = False
    kv_scale_placement: str = "row"        # per-token-head scales: "row" (vLLM's) or "block" (minikv.cache.layout)
    kv_cache_memory_bytes: int | None = None   # the KV-cache budget; None: minikv.engine.memory's default
    gpu_memory_utilization: float = 0.9    # CUDA, without a budget: the share of the device's memory to use
    # vLLM's option: in a prefill step, the layers that share another layer's K/V (they write none) run only on
    # each sequence's last token, the one whose logits are sampled (Gemma-4; other models ignore it)
    kv_sharing_fast_prefill: bool = False

    def __post_init__(self):
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_block_size(self.block_size)
        check_int("num_blocks", self.num_blocks, allow_none=True)
        check_int("cross_pool_blocks", self.cross_pool_blocks, allow_none=True)
        check_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, allow_none=True)
        if self.num_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise InvalidValueError(f"num_blocks={self.num_blocks} and kv_cache_memory_bytes="
                                    f"{self.kv_cache_memory_bytes} both size the KV cache: give one of them")
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)):
            raise InvalidTypeError(f"gpu_memory_utilization must be a float, got {type(u).__name__} {u!r}")
        if not 0 < u <= 1:
            raise InvalidValueError(f"gpu_memory_utilization must be in (0, 1], a share of the device's memory; "
                                    f"got {u}")
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_bool("kv_sharing_fast_prefill", self.kv_sharing_fast_prefill)
        check_scale_placement(self.kv_scale_placement)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096
    max_model_len: int | None = None       # None: the model's context length, or less if the cache holds less

    def __post_init__(self):
        check_int("max_num_seqs", self.max_num_seqs)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens)
        check_int("max_model_len", self.max_model_len, low=2, allow_none=True)


@dataclass(frozen=True)
class ReproConfig:
    """The switches the reproductions turn, each an engine variant upstream had or a shape it ran in."""

    check_layout: bool = True
    warmup: str = "dummy"                   # WARMUP_SHAPES
    reinit_scales_on_wake: bool = True
    kv_arena: str = "one"                   # KV_ARENAS
    cross_context_path: str = "fused"       # CROSS_CONTEXT_PATHS
    paged_context: bool = False
    cross_construction: str = "eager"       # CONSTRUCTION_ORDERS

    @staticmethod
    def moved_keywords_error(moved: dict) -> InvalidTypeError:
        """The TypeError for keywords LLM no longer takes: the reproduction switches now live here."""
        unknown = sorted(set(moved) - set(ReproConfig.__dataclass_fields__))
        if unknown:
            return InvalidTypeError(f"LLM() got an unexpected keyword argument {unknown[0]!r}")
        spelled = ", ".join(f"{k}={v!r}" for k, v in moved.items())
        return InvalidTypeError(f"LLM({', '.join(moved)}=...) is now a reproduction switch: pass "
                                f"repro=minikv.ReproConfig({spelled})")

    def __post_init__(self):
        for name in ("check_layout", "paged_context", "reinit_scales_on_wake"):
            check_bool(name, getattr(self, name))
        check_choice("warmup", self.warmup, WARMUP_SHAPES)
        check_choice("kv_arena", self.kv_arena, KV_ARENAS)
        check_choice("cross_context_path", self.cross_context_path, CROSS_CONTEXT_PATHS)
        check_choice("cross_construction", self.cross_construction, CONSTRUCTION_ORDERS)


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine is built from."""

    model: Gemma4Config | T5Config | None   # what the engine reads: num_layers, num_kv_heads, kv_sharing...
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device
    dtype: torch.dtype | None = None        # activations; None: the model's default (float32 CPU, bfloat16 CUDA)
    backend: object = "triton"              # "triton", "torch", an adapter's name, or an AttentionBackend
    reintroduce: tuple[str, ...] = ()       # minikv.bugs.DEFECTS names; stored sorted
    sanitize: bool = True                   # check the arena's guard canaries after every step
    seed: int = 0
    repro: ReproConfig = ReproConfig()      # the reproductions' switches (the shipped engine: the defaults)
    enforce_eager: bool | None = None       # True: no CUDA graphs; None: graphs on CUDA (triton backend), not CPU

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode steps run through CUDA graphs (minikv.engine.cuda_graph)."""
        return not self.enforce_eager and self.device.type == "cuda" and self.backend == "triton"

    def __post_init__(self):
        if not isinstance(self.cache, CacheConfig):
            raise InvalidTypeError(f"cache must be a CacheConfig, got {type(self.cache).__name__}")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise InvalidTypeError(f"scheduler must be a SchedulerConfig, got {type(self.scheduler).__name__}")
        object.__setattr__(self, "device", resolve_device(self.device))
        if self.dtype is not None and self.dtype not in ACTIVATION_DTYPES:
            raise InvalidTypeError(f"dtype must be torch.float32, torch.float16, torch.bfloat16 or None, got {self.dtype!r}")
        check_backend(self.backend)
        object.__setattr__(self, "reintroduce", tuple(sorted(registry.validate(self.reintroduce))))
        if not isinstance(self.repro, ReproConfig):
            raise InvalidTypeError(f"repro must be a minikv.ReproConfig, got {type(self.repro).__name__} {self.repro!r}")
        check_bool("sanitize", self.sanitize)
        if self.enforce_eager is not None:
            check_bool("enforce_eager", self.enforce_eager)
        check_int("seed", self.seed, low=0, high=MAX_SEED)
        if self.model is not None:
            self._check_model_options()

    def with_model(self, model: Gemma4Config | T5Config, dtype: torch.dtype) -> EngineConfig:
        """This config for the loaded model (checked again, now with the model-dependent rules)."""
        return dataclasses.replace(self, model=model, dtype=dtype)

    def _check_model_options(self) -> None:
        """Options that mean nothing for this model are refused, not ignored, saying why."""
        mc, defects = self.model, set(self.reintroduce)
        if not mc.is_encoder_decoder:
            default = ReproConfig.__dataclass_fields__
            for name in ("cross_context_path", "paged_context", "cross_construction"):
                if getattr(self.repro, name) != default[name].default:
                    raise InvalidValueError(f"ReproConfig.{name} applies to encoder-decoder models (cross attention); "
                                            f"{mc.name} is decoder-only: leave it at its default")
            if self.cache.cross_pool_blocks is not None:
                raise InvalidValueError(f"cross_pool_blocks applies to encoder-decoder models (the cross pool); {mc.name} "
                                        f"is decoder-only: leave it None")
        # A defect switched on where its mechanism cannot occur would silently do nothing.
        if "scale-wipe" in defects and not mc.kv_sharing:
            raise InvalidValueError(f"scale-wipe cannot happen in {mc.name}: it has no KV-sharing layers (the wipe is a "
                                    f"sharing layer's late first touch of its target's cache); use tiny-gemma4")
        for name in sorted(defects & {"cross-stride", "cross-fp8-context-read"}):
            if not mc.is_encoder_decoder:
                raise InvalidValueError(f"{name} cannot happen in {mc.name}: it is decoder-only, with no cross attention; "
                                        f"use tiny-t5")
            if self.cache.kv_cache_dtype == "auto":
                raise InvalidValueError(f"{name} cannot happen with kv_cache_dtype='auto': the cross pool then holds the "
                                        f"model's own 16-bit (or wider) elements, so nothing is misread; use "
                                        f"kv_cache_dtype='fp8'")
