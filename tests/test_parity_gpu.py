"""Parity with transformers on a CUDA GPU, in bfloat16 (skipped without one; `make test-gpu` runs it).

bfloat16 has 8 bits of mantissa, so two correct implementations that round in different places disagree in
their logits by a few percent of the logits' scale. The tolerance used here is therefore relative to
transformers' *own* bfloat16 error: both libraries run the same weights in bfloat16 and are compared with
transformers in float32 (the truth); minikv's error may be at most `BF16_SLACK` times transformers' plus 1% of the
logits' scale. Checked: the shipped checkpoints and tiny random configs at the context step and at every decode
step, greedy ids through the paged engine (triton backend, `auto` cache) against transformers' `generate`, and
random-init models at real models' layer dimensions (flan-t5-base's, and gemma-4-E2B's with a smaller vocabulary).
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

import minikv
from minikv import tasks
from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import FULL, SLIDING, DenseKVCache
from minikv.models.hf_checkpoint import load_checkpoint
from minikv.models.t5 import DenseKVCache as T5Cache
from minikv.models.tokenizer import CharTokenizer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF16_SLACK = 2.0
S, F = SLIDING, FULL


def within_bf16(ours: torch.Tensor, theirs: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(minikv's max error, transformers' max error) against the float32 truth; asserts the tolerance."""
    ours_err = float((ours.float() - truth).abs().max())
    their_err = float((theirs.float() - truth).abs().max())
    scale = float(truth.abs().max())
    assert ours_err <= BF16_SLACK * their_err + 0.01 * scale, (ours_err, their_err, scale)
    return ours_err, their_err


def _hf_class(path):
    import json
    model_type = json.loads((path / "config.json").read_text())["model_type"]
    return transformers.T5ForConditionalGeneration if model_type == "t5" else transformers.Gemma4ForCausalLM


def _pair(path, dtype):
    hf = _hf_class(path).from_pretrained(path, attn_implementation="sdpa", torch_dtype=dtype).cuda().eval()
    ours = load_checkpoint(path).to(device="cuda", dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    return hf, ours


@torch.no_grad()
def _decoder_logits(model_is_hf: bool, model, ids: torch.Tensor, prefill: int, encoder_ids=None):
    """Logits at the context step (all `prefill` positions) and at every later decode step, one token per call.
    For T5, `ids` are decoder ids and `encoder_ids` the encoder's input."""
    if model_is_hf:
        enc = {} if encoder_ids is None else {"encoder_outputs": model.encoder(input_ids=encoder_ids)}
        key = "input_ids" if encoder_ids is None else "decoder_input_ids"
        out = model(**{key: ids[:, :prefill]}, **enc, use_cache=True)
        logits = [out.logits]
        for t in range(prefill, ids.shape[1]):
            out = model(**{key: ids[:, t:t + 1]}, **enc, use_cache=True, past_key_values=out.past_key_values)
            logits.append(out.logits)
        return torch.cat(logits, dim=1)
    if encoder_ids is not None:
        enc, cache = model.encode(encoder_ids), T5Cache()
        step = lambda part: model.compute_logits(model.decode(part, enc, None, cache))     # noqa: E731
    else:
        cache = DenseKVCache()
        step = lambda part: model.logits(part, cache)                                       # noqa: E731
    logits = [step(ids[:, :prefill])]
    for t in range(prefill, ids.shape[1]):
        logits.append(step(ids[:, t:t + 1]))
    return torch.cat(logits, dim=1)


def _check_logits(path, vocab: int, is_t5: bool, length: int = 24, prefill: int = 8):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, length), generator=g).cuda()
    enc = torch.randint(3, vocab, (2, 15), generator=g).cuda() if is_t5 else None
    truth = _decoder_logits(True, _pair(path, torch.float32)[0], ids, prefill, enc).float()
    hf, ours = _pair(path, torch.bfloat16)
    return within_bf16(_decoder_logits(False, ours, ids, prefill, enc), _decoder_logits(True, hf, ids, prefill, enc),
                       truth)


def _shipped_dir(name: str):
    return registry.WEIGHTS_DIR / name


@pytest.mark.parametrize("name", ["tiny-gemma4", "tiny-t5"])
def test_shipped_checkpoint_bf16_logits(name):
    model = registry.load_model(name)
    vocab = model.config.vocab_size
    ours_err, their_err = _check_logits(_shipped_dir(name), vocab, name == "tiny-t5")
    print(f"{name}: bf16 max |logit error| minikv {ours_err:.3g}, transformers {their_err:.3g}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["tiny-gemma4", "tiny-t5"])
def test_shipped_checkpoint_engine_greedy_against_generate(name, dtype):
    """float32: the paged engine's greedy ids (triton kernels compiled for the GPU) equal transformers' `generate`.
    bfloat16: weights rounded to 8 mantissa bits move near-tied answers in both libraries, each its own way, so
    ids are not compared token for token; both must still solve nearly all prompts, and the engine agrees with
    transformers on most."""
    task = tasks.for_model(name)
    prompts = task.prompts(32, seed=3)
    llm = minikv.LLM(model=name, device="cuda", backend="triton", dtype=dtype, max_num_seqs=8)
    params = [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts]
    outs = llm.generate(prompts, params, use_tqdm=False)
    hf, _ = _pair(_shipped_dir(name), dtype)
    hf.generation_config.eos_token_id = llm.tokenizer.eos_id
    agree = hf_right = 0
    for prompt, param, out in zip(prompts, params, outs):
        bos = [] if name == "tiny-t5" else [llm.tokenizer.bos_id]        # as the engine feeds a decoder-only model
        ids = torch.tensor([bos + llm.tokenizer.encode(prompt)]).cuda()
        expected = hf.generate(ids, max_new_tokens=param.max_tokens, do_sample=False)[0]
        expected = (expected[1:] if name == "tiny-t5" else expected[ids.shape[1]:]).tolist()
        expected = expected[:-1] if expected and expected[-1] == llm.tokenizer.eos_id else expected
        agree += out.token_ids == expected
        hf_right += task.check(prompt, llm.tokenizer.decode(expected))
    ours_right = sum(task.check(p, o.text) for p, o in zip(prompts, outs))
    print(f"{name} {dtype}: engine = generate on {agree}/32, right: engine {ours_right}, transformers {hf_right}")
    if dtype == torch.float32:
        assert agree == len(prompts)
    else:
        assert ours_right >= 0.9 * len(prompts) and hf_right >= 0.9 * len(prompts) and agree >= 0.75 * len(prompts)


def _random_dir(tmp_path, hf_model, vocab_chars: str | None = None):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.02) + (p.dim() == 1))
    hf_model.save_pretrained(tmp_path)
    save_char_tokenizer(CharTokenizer(vocab_chars) if vocab_chars else CharTokenizer(), tmp_path)
    return tmp_path


def test_random_t5_at_flan_t5_base_dims_bf16(tmp_path, monkeypatch):
    """flan-t5-base's layer dimensions (d_model 768, 12 heads of 64, d_ff 2048, 12+12 layers, 32 buckets up to
    distance 128): logits in bf16, and greedy ids through the paged engine against `generate`."""
    config = transformers.T5Config(vocab_size=CharTokenizer().vocab_size, d_model=768, d_kv=64, d_ff=2048,
                                   num_layers=12, num_decoder_layers=12, num_heads=12,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                   decoder_start_token_id=0, dropout_rate=0.0)
    path = _random_dir(tmp_path, transformers.T5ForConditionalGeneration(config).eval())
    ours_err, their_err = _check_logits(path, config.vocab_size, True)
    print(f"t5-base dims: bf16 max |logit error| minikv {ours_err:.3g}, transformers {their_err:.3g}")
    llm = minikv.LLM(model=str(path), device="cuda", backend="triton", dtype=torch.float32, max_num_seqs=4)
    prompts = ["hello world", "minikv", "the quick brown fox"]
    outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    # A random model's top logits nearly tie, and tl.dot rounds float32 inputs through TF32 on the GPU, so ids are
    # checked as greedy up to tolerance: under transformers' float32 model, fed the engine's own tokens, every
    # token the engine picked is within 1% of the logits' scale of the best one.
    hf = transformers.T5ForConditionalGeneration.from_pretrained(path, attn_implementation="sdpa").cuda().eval()
    exact = 0
    for prompt, out in zip(prompts, outs):
        enc = torch.tensor([llm.tokenizer.encode(prompt)]).cuda()
        dec = torch.tensor([[config.decoder_start_token_id] + out.token_ids[:-1]]).cuda()
        with torch.no_grad():
            logits = hf(input_ids=enc, decoder_input_ids=dec).logits[0].float()
        picked = logits[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids).cuda()]
        gap = logits.max(dim=-1).values - picked
        assert float(gap.max()) <= 0.01 * float(logits.abs().max()), (prompt, gap.tolist())
        exact += int((gap == 0).sum())
    print(f"t5-base dims: engine's greedy ids are transformers' argmax at {exact} of {8 * len(prompts)} steps")


def test_random_gemma4_at_e2b_layer_dims_bf16(tmp_path):
    """gemma-4-E2B's layer dimensions (hidden 1536, 35 layers of 4 sliding : 1 full, 8 query heads over 1 KV head,
    head size 256 sliding / 512 full, the last 20 layers sharing KV, per-layer inputs of 256, window 512) with a
    262,144 -> 4,096 smaller vocabulary (its embeddings alone would be 2.7 B parameters): bf16 logits over a
    prompt longer than the window."""
    kwargs = dict(vocab_size=4096, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
                  layer_types=[S, S, S, S, F] * 7, sliding_window=512, num_kv_shared_layers=20,
                  hidden_size_per_layer_input=256, vocab_size_per_layer_input=4096, final_logit_softcapping=30.0,
                  max_position_embeddings=4096)
    with torch.device("cuda"):
        hf = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**kwargs)).eval()
    path = _random_dir(tmp_path, hf)
    ours_err, their_err = _check_logits(path, kwargs["vocab_size"], False, length=600, prefill=590)
    print(f"gemma-4-E2B dims: bf16 max |logit error| minikv {ours_err:.3g}, transformers {their_err:.3g}")
