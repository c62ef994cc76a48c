"""The sampler: one token per sequence from a step's logits, as each request's SamplingParams asks.
See docs/internals.md#engine-sampler."""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """`logits` (one row, float32) divided by `temperature`, with the tokens min_p / top_k / top_p drop set to
    -inf. A filter at its default (min_p 0, top_k 0 or -1, top_p 1) changes nothing."""
    out = logits / temperature
    if min_p > 0:
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < min_p * probs.max(), NEG_INF)
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, NEG_INF)
    if top_p < 1:
        probs, order = torch.sort(torch.softmax(out, dim=-1), descending=True)
        before = torch.cumsum(probs, dim=-1) - probs          # probability of the more likely tokens
        drop = before >= top_p
        drop[0] = False                                       # the most likely token always stays
        out = out.clone()
        out[order[drop]] = NEG_INF
    return out


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> dict[int, tuple[float, int]]:
    """{token id: (logprob, rank)} for the k most likely tokens and `token`, under the raw `logits` (one row)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = {}
    if k > 0:
        values, ids = torch.topk(logp, k)
        out = {int(i): (float(v), r + 1) for r, (v, i) in enumerate(zip(values.tolist(), ids.tolist()))}
    if token not in out:
        out[token] = (float(logp[token]), int((logp > logp[token]).sum()) + 1)
    return out


def sample(logits: torch.Tensor, seqs) -> tuple[list[int], list | None]:
    """The token each sequence samples from its row of `logits`, and, when any sequence asked for logprobs, one
    entry per sequence (its `token_logprobs`, or None)."""
    greedy = logits.argmax(dim=-1).tolist()
    tokens = []
    for i, (s, g) in enumerate(zip(seqs, greedy)):       # rows are taken only where sampled (a view each)
        p = s.sampling
        if p.temperature == 0:
            tokens.append(g)
            continue
        filtered = filter_logits(logits[i].float().cpu(), p.temperature, p.top_k, p.top_p, p.min_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=s.generator)))
    if all(s.sampling.logprobs is None for s in seqs):
        return tokens, None
    return tokens, [None if s.sampling.logprobs is None else token_logprobs(row.cpu(), t, s.sampling.logprobs)
                    for row, s, t in zip(logits, seqs, tokens)]
