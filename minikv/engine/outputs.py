"""What a finished request returns, shaped as vLLM's: a RequestOutput holding one CompletionOutput per completion.
`out = llm.generate(...)[0]` has request_id, prompt, prompt_token_ids, finished and outputs (one per completion).
`out.text`, `.token_ids` and `.finish_reason` are documented aliases of `out.outputs[0]`'s (one completion is the
usual case, and the notebooks read them). Unlike vLLM: request ids are ints, and a stop token is not in token_ids.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Logprob:
    """One token's log probability under the model's raw logits, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None             # None with SamplingParams(detokenize=False)


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a request.

    `index`: which of the request's n completions. `token_ids`: the generated ids (the prompt's are not
    repeated). `text`: their text, cut at a stop string. `finish_reason`: "length" (max_tokens reached), "stop"
    (EOS, a stop token or a stop string) or "abort"; `stop_reason`: None for EOS (or a completion that did not
    stop), the stop string, or the stop token id. `logprobs`: with SamplingParams(temperature=0, logprobs=k), one dict per
    generated token, token id -> Logprob, holding the k most likely tokens and the sampled one; else None.
    `cumulative_logprob`: the sum of the sampled tokens' logprobs, when logprobs were asked for; else None.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestOutput:
    """One request: its prompt, and `outputs`, one CompletionOutput per completion (SamplingParams.n).

    `prompt` is None for a request given as token ids. For an encoder-decoder model, `prompt` and
    `prompt_token_ids` are the decoder's, and `encoder_prompt` / `encoder_prompt_token_ids` the encoder's.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None

    # Aliases of the first completion: `out.text` is `out.outputs[0].text`.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
