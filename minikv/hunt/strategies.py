"""The hypothesis strategies: every knob of an engine configuration, and requests to serve with it.
See docs/internals.md#hunt-strategies."""
from __future__ import annotations

import functools
from pathlib import Path

from hypothesis import strategies as st

from .reference import MAX_TOKENS
from .scenario import DTYPES, Request, Scenario, blocks_for

BLOCK_SIZES = (16, 8, 32, 64)            # the engine's default first
PROMPT_POOL = 12                          # held-out prompts per model, shortest first
MAX_REQUESTS = 4
MAX_ARRIVAL = 3                           # steps after a wave's first step
MAX_NUM_SEQS = 4
MAX_PROMPT_TOKENS = 40                    # a checkpoint's prompts (its own tokens)
MAX_EXTRA_BLOCKS = 6                      # pool sizes: the smallest that works, plus up to this many blocks


def cells(models=None, kv_cache_dtypes=None, dtypes=None) -> list[tuple[str, str, str]]:
    """Every (model, KV cache format, activation dtype), 16-bit first (what production engines serve in)."""
    from minikv.config import KV_CACHE_DTYPES
    from minikv.models.registry import TRAINED_MODELS
    return [(m, f, d) for m in (models or TRAINED_MODELS) for f in (kv_cache_dtypes or KV_CACHE_DTYPES)
            for d in (dtypes or DTYPES)]


def is_shipped(model: str) -> bool:
    """A model minikv ships (with a task that knows its prompts), as opposed to a checkpoint directory."""
    from minikv.models import registry
    return registry.is_checkpoint_model(model)


def model_label(model: str) -> str:
    """How reports and figures name a model: a shipped model's name, a checkpoint directory's last component."""
    return model if is_shipped(model) else (Path(model).name or str(model))


def cell_label(cell) -> str:
    return " x ".join((model_label(cell[0]), *cell[1:]))


@functools.lru_cache(maxsize=None)
def _tokenizer(model: str):
    from minikv.models import registry
    return registry.get_tokenizer(model)


@functools.lru_cache(maxsize=None)
def prompt_pool(model: str) -> tuple[str, ...]:
    """The prompts a cell's requests are drawn from, shortest first."""
    if not is_shipped(model):
        return tuple(sorted(checkpoint_prompts(model), key=lambda p: (len(p), p)))
    from minikv.models import tasks
    return tuple(sorted(tasks.for_model(model).prompts(n=PROMPT_POOL, seed=0), key=lambda p: (len(p), p)))


def _round_trips(tok, text: str) -> bool:
    try:
        return bool(text.strip()) and tok.decode(tok.encode(text)) == text
    except (ValueError, KeyError, TypeError):
        return False


def checkpoint_prompts(model: str, n: int = PROMPT_POOL, seed: int = 0) -> list[str]:
    """Prompts for a checkpoint directory that round-trip through its own tokenizer."""
    import random

    from minikv.models import tasks
    tok = _tokenizer(model)
    out: list[str] = []
    try:
        task = tasks.for_checkpoint(tok, model=model_label(model), encoder_decoder=model_is_encoder_decoder(model))
        candidates = task.prompts(n=4 * n, seed=seed)
    except ValueError:
        candidates = []
    for p in candidates:
        if len(out) < n and p not in out and _round_trips(tok, p) and len(tok.encode(p)) <= MAX_PROMPT_TOKENS:
            out.append(p)
    rng = random.Random(f"round-trip:{model_label(model)}:{seed}")
    specials = {tok.pad_id, tok.bos_id, tok.eos_id}
    vocab = min(tok.vocab_size, getattr(tok, "model_vocab", None) or tok.vocab_size)
    ids = [i for i in range(vocab) if i not in specials]
    for _ in range(200 * n):
        if len(out) >= n or not ids:
            break
        text = tok.decode(rng.choices(ids, k=rng.randint(2, MAX_PROMPT_TOKENS)))
        if text not in out and _round_trips(tok, text) and len(tok.encode(text)) <= MAX_PROMPT_TOKENS:
            out.append(text)
    if not out:
        raise ValueError(f"{model}: its tokenizer writes back no prompt unchanged (neither the arithmetic or sort "
                         f"tasks' prompts nor random token sequences), so the engine and the reference would not "
                         f"see the same tokens")
    return out


def longer_window(model: str, prompt: str, extra_terms: int) -> str:
    """For the arithmetic model: the same sequence with more terms, so two prompts share a prefix (what prefix
    caching reuses). Other models' prompts are returned unchanged."""
    from minikv.models import tasks
    if extra_terms == 0 or not is_shipped(model):
        return prompt
    task = tasks.for_model(model)
    if not hasattr(task, "prompt_text"):
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


def token_counts(model: str, prompt: str) -> tuple[int, int]:
    """(decoder prompt tokens, encoder tokens) of a prompt."""
    n = len(_tokenizer(model).encode(prompt))
    if model_is_encoder_decoder(model):
        return 1, n                        # the decoder starts from its start token
    return 1 + n, 0                        # BOS + the prompt


@functools.lru_cache(maxsize=None)
def model_is_encoder_decoder(model: str) -> bool:
    from minikv.models import hf_checkpoint, registry
    if is_shipped(model):
        return bool(registry.model_config(model).is_encoder_decoder)
    return hf_checkpoint.read_config(model).get("model_type") == "t5"


@functools.lru_cache(maxsize=None)
def model_shares_kv(model: str) -> bool:
    """Whether the model has layers that read another layer's K/V (kv_sharing_fast_prefill then matters)."""
    from minikv.models import hf_checkpoint, registry
    if is_shipped(model):
        return bool(getattr(registry.model_config(model), "num_kv_shared_layers", 0))
    config = hf_checkpoint.read_config(model)
    return bool(config.get("num_kv_shared_layers") or config.get("text_config", {}).get("num_kv_shared_layers"))


@st.composite
def requests(draw, model: str):
    pool = prompt_pool(model)
    prompt = pool[draw(st.integers(0, len(pool) - 1))]
    prompt = longer_window(model, prompt, draw(st.integers(0, 3)))
    return Request(prompt, max_tokens=draw(st.integers(1, MAX_TOKENS)), arrival=draw(st.integers(0, MAX_ARRIVAL)))


SUFFIX_TOKENS = 6                         # a shared-prefix request's own tokens after the prefix, at most


@functools.lru_cache(maxsize=None)
def _max_positions(model: str) -> int:
    from minikv.models import hf_checkpoint
    config = hf_checkpoint.read_config(model)
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else 1 << 16


def prefix_lengths(model: str, block_size: int) -> list[int]:
    """Shared-prefix lengths (BOS included) around the block boundaries of `block_size`."""
    room = _max_positions(model) - SUFFIX_TOKENS - MAX_TOKENS - 1
    return [k for k in (block_size - 1, block_size, block_size + 1, 2 * block_size, 2 * block_size + 1,
                        3 * block_size - 1) if k <= room]


@functools.lru_cache(maxsize=None)
def _prefix_source(model: str) -> tuple[int, ...]:
    """Token ids of the checkpoint's prompt pool, one after the other: where shared prefixes are cut from."""
    tok = _tokenizer(model)
    return tuple(tok.encode(" ".join(prompt_pool(model))))


@functools.lru_cache(maxsize=None)
def shared_prefix_prompts(model: str, prefix_tokens: int, n: int) -> tuple[str, ...] | None:
    """`n` prompts whose tokens share exactly their first `prefix_tokens`, or None."""
    tok = _tokenizer(model)
    source = _prefix_source(model)
    k = prefix_tokens - 1
    if k < 1 or len(source) < k:
        return None
    prefix, out, seen = list(source[:k]), [], set()
    for candidate in prompt_pool(model):
        own = tok.encode(" " + candidate)[:SUFFIX_TOKENS]
        ids = prefix + own
        if not own or own[0] in seen:
            continue                          # the requests must part right after the prefix
        text = tok.decode(ids)
        try:
            same = tok.encode(text) == ids
        except (ValueError, KeyError):
            same = False
        if same:
            out.append(text)
            seen.add(own[0])
        if len(out) == n:
            return tuple(out)
    return None


@st.composite
def prefix_requests(draw, model: str, block_size: int):
    """Two to MAX_REQUESTS requests sharing a prefix of one of `prefix_lengths` (what prefix caching reuses, a
    block at a time), or None when the checkpoint's tokenizer gives no such set."""
    lengths = prefix_lengths(model, block_size)
    if not lengths:
        return None
    shared = draw(st.sampled_from(lengths))
    n = draw(st.integers(2, MAX_REQUESTS))
    prompts = shared_prefix_prompts(model, shared, n)
    if prompts is None:
        return None
    return tuple(Request(p, max_tokens=draw(st.integers(1, MAX_TOKENS)), arrival=draw(st.integers(0, MAX_ARRIVAL)))
                 for p in prompts)


@st.composite
def scenarios(draw, cell: tuple[str, str, str]):
    model, kv_cache_dtype, dtype = cell
    if is_shipped(model) or model_is_encoder_decoder(model):
        reqs = tuple(draw(st.lists(requests(model), min_size=1, max_size=MAX_REQUESTS)))
        block_size = draw(st.sampled_from(BLOCK_SIZES))
    else:
        # A decoder-only checkpoint's prompts are free: besides requests drawn from the pool, sets that share a
        # prefix ending inside a block, at a block boundary or several blocks in (prefix caching is drawn below,
        # on or off). The block size comes first, since the prefix lengths are counted in blocks.
        block_size = draw(st.sampled_from(BLOCK_SIZES))
        reqs = draw(prefix_requests(model, block_size)) if draw(st.booleans()) else None
        if reqs is None:
            reqs = tuple(draw(st.lists(requests(model), min_size=1, max_size=MAX_REQUESTS)))
    per_token_head = kv_cache_dtype.endswith("_per_token_head")
    placement = draw(st.sampled_from(("row", "block"))) if per_token_head else "row"
    repeat = draw(st.booleans())
    sleep = draw(st.sampled_from((None, "discard", "free"))) if repeat else None
    sizes = [token_counts(model, r.prompt) for r in reqs]
    extra = draw(st.one_of(st.none(), st.integers(0, MAX_EXTRA_BLOCKS)))
    num_blocks = None if extra is None else extra + max(
        blocks_for(dec + r.max_tokens, block_size) for r, (dec, _) in zip(reqs, sizes))
    cross_pool_blocks = None
    if any(enc for _, enc in sizes):
        extra = draw(st.one_of(st.none(), st.integers(0, MAX_EXTRA_BLOCKS)))
        cross_pool_blocks = None if extra is None else extra + max(blocks_for(enc, block_size) for _, enc in sizes)
    max_num_seqs, prefix_caching = draw(st.integers(1, MAX_NUM_SEQS)), draw(st.booleans())
    fast_prefill = draw(st.booleans()) if model_shares_kv(model) else False      # drawn last: the rest as before
    return Scenario(model=model, kv_cache_dtype=kv_cache_dtype, dtype=dtype, requests=reqs,
                    kv_scale_placement=placement, block_size=block_size, max_num_seqs=max_num_seqs,
                    enable_prefix_caching=prefix_caching, num_blocks=num_blocks, cross_pool_blocks=cross_pool_blocks,
                    repeat=repeat, sleep=sleep, kv_sharing_fast_prefill=fast_prefill)
