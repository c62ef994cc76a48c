"""The hypothesis strategies: every knob of an engine configuration, and requests to serve with it.

The search is stratified by *cell*: (model, KV cache format, activation dtype), the three choices that select
different code paths through the engine (another model's attention layers, another cache layout and kernels'
element format, another context-attention path). Inside a cell, hypothesis draws everything else: batch
geometry (`max_num_seqs`, block size), scale placement, pool sizes down to the smallest the requests can run in,
prefix caching, the requests (prompts, lengths, repeats, arrival steps), a second submission of the same batch
and a sleep/wake between the two.

Every draw shrinks toward the plainest configuration (the first listed choice, the smallest number, fewer
requests, the shortest prompt), so a failure shrinks to a minimal reproduction.
"""
from __future__ import annotations

from hypothesis import strategies as st

from .reference import MAX_TOKENS
from .scenario import DTYPES, Request, Scenario, blocks_for

BLOCK_SIZES = (16, 8, 32, 64)            # the engine's default first
PROMPT_POOL = 12                          # held-out prompts per model, shortest first
MAX_REQUESTS = 4
MAX_ARRIVAL = 3                           # steps after a wave's first step
MAX_NUM_SEQS = 4
MAX_EXTRA_BLOCKS = 6                      # pool sizes: the smallest that works, plus up to this many blocks


def cells(models=None, kv_cache_dtypes=None, dtypes=None) -> list[tuple[str, str, str]]:
    """Every (model, KV cache format, activation dtype), 16-bit first (what production engines serve in).

    The default models are the trained ones: the prompt pool is made of prompts the model answers right, which a
    random-weight model (tiny-gemma4-e2b) does not; pass `models=` to hunt over it anyway."""
    from minikv.config import KV_CACHE_DTYPES
    from minikv.models.registry import TRAINED_MODELS
    return [(m, f, d) for m in (models or TRAINED_MODELS) for f in (kv_cache_dtypes or KV_CACHE_DTYPES)
            for d in (dtypes or DTYPES)]


def prompt_pool(model: str) -> list[str]:
    """The model task's held-out prompts (it answers them right), shortest first."""
    from minikv import tasks
    return sorted(tasks.for_model(model).prompts(n=PROMPT_POOL, seed=0), key=lambda p: (len(p), p))


def longer_window(model: str, prompt: str, extra_terms: int) -> str:
    """For the arithmetic model: the same sequence with more terms, so two prompts share a prefix (what prefix
    caching reuses). Other models' prompts are returned unchanged."""
    from minikv import tasks
    task = tasks.for_model(model)
    if extra_terms == 0 or not hasattr(task, "prompt_text"):
        return prompt
    first, step, terms = task.validate(prompt)
    for k in range(extra_terms, 0, -1):
        longer = task.prompt_text(first, step, terms + k)
        try:
            task.validate(longer)
            return longer
        except ValueError:
            continue
    return prompt


def _tokens(model: str, prompt: str) -> tuple[int, int]:
    """(decoder prompt tokens, encoder tokens) of a prompt."""
    from minikv.models import registry
    n = len(registry.get_tokenizer(model).encode(prompt))
    if model_is_encoder_decoder(model):
        return 1, n                        # the decoder starts from its start token
    return 1 + n, 0                        # BOS + the prompt


def model_is_encoder_decoder(model: str) -> bool:
    from minikv.models import registry
    return bool(registry.model_config(model).is_encoder_decoder)


@st.composite
def requests(draw, model: str):
    pool = prompt_pool(model)
    prompt = pool[draw(st.integers(0, len(pool) - 1))]
    prompt = longer_window(model, prompt, draw(st.integers(0, 3)))
    return Request(prompt, max_tokens=draw(st.integers(1, MAX_TOKENS)), arrival=draw(st.integers(0, MAX_ARRIVAL)))


@st.composite
def scenarios(draw, cell: tuple[str, str, str]):
    model, kv_cache_dtype, dtype = cell
    reqs = tuple(draw(st.lists(requests(model), min_size=1, max_size=MAX_REQUESTS)))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    per_token_head = kv_cache_dtype.endswith("_per_token_head")
    placement = draw(st.sampled_from(("row", "block"))) if per_token_head else "row"
    repeat = draw(st.booleans())
    sleep = draw(st.sampled_from((None, "discard", "free"))) if repeat else None
    sizes = [_tokens(model, r.prompt) for r in reqs]
    extra = draw(st.one_of(st.none(), st.integers(0, MAX_EXTRA_BLOCKS)))
    num_blocks = None if extra is None else extra + max(
        blocks_for(dec + r.max_tokens - 1, block_size) for r, (dec, _) in zip(reqs, sizes))
    cross_pool_blocks = None
    if any(enc for _, enc in sizes):
        extra = draw(st.one_of(st.none(), st.integers(0, MAX_EXTRA_BLOCKS)))
        cross_pool_blocks = None if extra is None else extra + max(blocks_for(enc, block_size) for _, enc in sizes)
    return Scenario(model=model, kv_cache_dtype=kv_cache_dtype, dtype=dtype, requests=reqs,
                    kv_scale_placement=placement, block_size=block_size,
                    max_num_seqs=draw(st.integers(1, MAX_NUM_SEQS)),
                    enable_prefix_caching=draw(st.booleans()), num_blocks=num_blocks,
                    cross_pool_blocks=cross_pool_blocks, repeat=repeat, sleep=sleep)
