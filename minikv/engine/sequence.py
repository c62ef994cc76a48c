"""Requests as the engine sees them: sampling parameters, the running sequence, and the finished output.
See docs/internals.md#engine-sequence."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minikv.kernels.errors import InvalidTypeError, InvalidValueError

if TYPE_CHECKING:  # torch is imported only when a seeded generator is actually needed
    import torch

FINISH_REASONS = ("length", "stop", "eos", "abort")


# Temperatures below this make logits / temperature overflow float16 for ordinary logits; above MAX_TEMPERATURE
# sampling is uniform noise. Both bounds are far outside any useful setting.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request; frozen and validated when built."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidTypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens < 1:
            raise InvalidValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
            raise InvalidTypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):  # rejects NaN
            raise InvalidValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}, "
                                    f"got {self.temperature}")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise InvalidTypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
            if not 0 <= self.seed <= MAX_SEED:
                raise InvalidValueError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        if self.stop is not None:
            if isinstance(self.stop, str) or not isinstance(self.stop, (list, tuple)):
                raise InvalidTypeError(f"stop must be a list of strings or None, got {self.stop!r}")
            for text in self.stop:
                if not isinstance(text, str) or not text:
                    raise InvalidValueError(f"stop strings must be non-empty strings, got {text!r}")
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidTypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request in flight."""

    def __init__(
        self,
        request_id: int,
        prompt: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams | None = None,
        encoder_token_ids: list[int] | None = None,
        default_seed: int = 0,
    ):
        if len(prompt_token_ids) == 0:
            raise InvalidValueError(f"request {request_id}: the prompt has no tokens; at least one is needed")
        if encoder_token_ids is not None and len(encoder_token_ids) == 0:
            raise InvalidValueError(
                f"request {request_id}: encoder_token_ids is empty; pass None for a decoder-only model")
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.encoder_token_ids = None if encoder_token_ids is None else list(encoder_token_ids)
        self.cross_block_table: list[int] = []
        self.finish_reason: str | None = None
        self.generator: torch.Generator | None = None
        if self.sampling.temperature > 0:
            import torch

            seed = self.sampling.seed
            if seed is None:
                seed = (default_seed * 1_000_003 + request_id) % (1 << 63)
            self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(request_id={self.request_id}, status={self.status.name}, len={len(self)}, "
                f"outputs={self.num_output_tokens}, blocks={self.block_table}, "
                f"cached={self.num_cached_tokens})")

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (without the prompt)."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))


@dataclass(frozen=True)
class RequestOutput:
    """One finished request. `token_ids` are the generated ids only; `text` is their decoded text."""

    request_id: int
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
