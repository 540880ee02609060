"""The check users trust: parax's single-rank output against Hugging Face
`transformers` (PyPI) loading the very same safetensors checkpoint (with a
config.json) through `AutoModelForCausalLM.from_pretrained`, for every family
it implements here (transformers 4.51.3, pinned in python/requirements.txt).

Tolerance: 1e-4 absolute on fp32 logits.
"""

import os

import numpy as np
import pytest

from conftest import Model
from parax.checkpoint import save_pretrained
from parax.models.presets import PRESETS

torch = pytest.importorskip("torch") if os.environ.get("PARAX_REQUIRE_TRANSFORMERS") != "1" \
    else __import__("torch")
transformers = pytest.importorskip("transformers") \
    if os.environ.get("PARAX_REQUIRE_TRANSFORMERS") != "1" else __import__("transformers")

TOL = 1e-4


def config_file(tmp_path, config, name="config.json"):
    """`config` written as a Hugging Face config.json: its path."""
    import json
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def transformers_logits(tmp_path, config, model):
    """transformers' model of `config` loaded from `model`'s weights, and its
    fp32 logits on the model's tokens."""
    directory = str(tmp_path / "hf")
    save_pretrained(directory, config, model.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        return hf, hf(torch.tensor(model.tokens, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-phi3",
                                    "tiny-gemma", "tiny-gemma2", "tiny-gemma3", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe",
                                    "tiny-deepseek-v3"])
def test_parax_matches_transformers(tmp_path, preset):
    model = Model(str(tmp_path), preset)
    directory = str(tmp_path / "hf")
    save_pretrained(directory, PRESETS[preset], model.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        expected = hf(torch.tensor(model.tokens, dtype=torch.long)).logits.numpy()
    logits = model.run(model.compile("single"), 1)
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() < TOL
    # And the numpy reference agrees with transformers too.
    assert np.abs(model.reference() - expected).max() < TOL


@pytest.mark.parametrize("preset,aux", [("tiny-llama", 0.0), ("tiny-qwen2", 0.0), ("tiny-gpt2", 0.0),
                                        ("tiny-mixtral", 0.0), ("tiny-qwen2-moe", 0.0), ("tiny-mixtral", 0.5),
                                        ("tiny-qwen2-moe", 0.5), ("tiny-deepseek-v3", 0.0), ("tiny-qwen3", 0.0),
                                        ("tiny-qwen3-moe", 0.5), ("tiny-phi3", 0.0), ("tiny-gemma", 0.0),
                                        ("tiny-gemma2", 0.0), ("tiny-gemma3", 0.0)],
                         ids=["llama", "qwen2", "gpt2", "mixtral", "qwen2-moe", "mixtral-aux", "qwen2-moe-aux",
                              "deepseek-v3", "qwen3", "qwen3-moe-aux", "phi3", "gemma", "gemma2", "gemma3"])
def test_training_gradients_match_transformers(tmp_path, preset, aux):
    """A training step's loss and every parameter's gradient (parax
    --parax-autodiff, one rank) against PyTorch's autograd through the
    transformers model loaded from the same checkpoint: the cross-entropy
    of the logits against the labels (as parax's loss: no shift, the mean
    over the tokens), plus, with a load-balancing weight, transformers' own
    `load_balancing_loss_func` of the routers' logits (every layer's
    together, as Mixtral's and Qwen2-MoE's forward adds it), weighted.
    parax's loss is that sum too. Tolerance: 1e-4 of the largest |gradient|
    of each; 1e-5 on the loss."""
    from test_training import gradients
    model = Model(str(tmp_path), preset, loss=True, aux_loss=aux)
    directory = str(tmp_path / "hf")
    save_pretrained(directory, PRESETS[preset], model.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()  # no dropout; gradients still flow
    tokens = torch.tensor(model.tokens, dtype=torch.long)
    labels = torch.tensor(model.labels, dtype=torch.long)
    out = hf(tokens, output_router_logits=aux > 0) if aux else hf(tokens)
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
    total = ce
    if aux:
        module = __import__(type(hf).__module__, fromlist=["load_balancing_loss_func"])
        cfg = hf.config
        total = ce + aux * module.load_balancing_loss_func(out.router_logits, cfg.num_experts if hasattr(
            cfg, "num_experts") else cfg.num_local_experts, cfg.num_experts_per_tok)
    total.backward()
    expected = {name: p.grad.numpy() for name, p in hf.named_parameters() if p.grad is not None}
    loss, grads = gradients(model, model.compile("train", autodiff=True), 1)
    assert abs(loss - float(total)) < 1e-5, (loss, float(total), float(ce))
    for name, grad in grads.items():
        if name not in expected and "lm_head" in name:  # tied to the embedding in transformers
            continue
        want = expected[name].reshape(grad.shape)
        diff = float(np.abs(grad - want).max())
        assert diff <= 1e-4 * max(float(np.abs(want).max()), 1e-6), (name, diff, float(np.abs(want).max()))
    missing = set(expected) - set(grads)
    assert not missing, missing


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 4.0},
    {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.3},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
], ids=["yarn", "yarn-betas-attention-factor", "linear", "dynamic", "llama3"])
def test_rope_scaling_matches_transformers(tmp_path, scaling):
    """Each rope scaling parax builds, at positions past the original
    context (32 tokens over a YaRN context of 128 / 4 and a Llama 3.1 one
    of 16): YaRN's ramp of interpolated channels and its factor on cos and
    sin (parax scales the scores by its square), linear interpolation,
    Llama 3.1's smoothed wavelengths; dynamic NTK, plain rotary within
    max_position_embeddings (a longer program is refused at build). The
    numpy reference agrees too."""
    model = Model(str(tmp_path), "tiny-llama", seq=32, overrides={"rope_scaling": dict(scaling)})
    directory = str(tmp_path / "hf")
    save_pretrained(directory, dict(PRESETS["tiny-llama"], rope_scaling=scaling), model.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        expected = hf(torch.tensor(model.tokens, dtype=torch.long)).logits.numpy()
    plain = Model(str(tmp_path / "plain"), "tiny-llama", seq=32)
    if scaling["rope_type"] != "dynamic":
        assert np.abs(plain.reference() - expected).max() > 100 * TOL  # the scaling shows
    assert np.abs(model.reference() - expected).max() < TOL
    logits = model.run(model.compile("single"), 1)
    assert np.abs(logits - expected).max() < TOL


@pytest.mark.parametrize("seq,rotary", [(12, 1.0), (32, 1.0), (32, 0.5), (12, 0.5)],
                         ids=["short-factors", "long-factors", "long-factors-partial", "short-factors-partial"])
def test_longrope_matches_transformers(tmp_path, seq, rotary):
    """Phi-3's LongRoPE (rope_scaling type 'su', as Phi-3-mini-128k's
    config.json once wrote it; transformers reads it as 'longrope'): each
    rotated pair's frequency divided by its own factor, the short list
    while a call's positions stay within original_max_position_embeddings
    (16 here), the long one past it (32 tokens), and cos and sin scaled by
    sqrt(1 + ln 8 / ln 16) (a context of 128 over 16; parax scales the
    scores by its square: every channel of a head turns, as in Phi-3-mini
    and -medium). On a head half of whose channels turn (Phi-4-mini's
    partial_rotary_factor, 0.5 here) the factor scales the turning channels
    alone: the rope's output, not the scores. The numpy reference agrees
    too, and the plain rotary does not."""
    pairs = int(PRESETS["tiny-phi3"]["hidden_size"] // PRESETS["tiny-phi3"]["num_attention_heads"] * rotary) // 2
    config = dict(PRESETS["tiny-phi3"], max_position_embeddings=128, original_max_position_embeddings=16,
                  partial_rotary_factor=rotary,
                  rope_scaling={"type": "su", "short_factor": [1.0, 1.1, 1.2, 1.3, 1.6, 2.0, 2.5, 3.0][:pairs],
                                "long_factor": [1.0, 1.5, 2.0, 2.5, 4.0, 6.0, 8.0, 12.0][:pairs]})
    model = Model(str(tmp_path / "parax"), config_file(tmp_path, config), seq=seq)
    _, expected = transformers_logits(tmp_path, config, model)
    unscaled = dict(config, max_position_embeddings=16)
    unscaled.pop("rope_scaling")
    plain = Model(str(tmp_path / "plain"), config_file(tmp_path, unscaled, "plain.json"), seq=seq)
    assert np.abs(plain.reference() - expected).max() > 100 * TOL  # the scaling shows
    assert np.abs(model.reference() - expected).max() < TOL
    logits = model.run(model.compile("single"), 1)
    assert np.abs(logits - expected).max() < TOL


@pytest.mark.parametrize("preset", ["tiny-mistral", "tiny-mixtral", "tiny-gemma2", "tiny-gemma3"])
def test_sliding_window_matches_transformers(tmp_path, preset):
    """A sliding window of 4 keys over 16 tokens (issue 44: Mixtral's was
    ignored, 3.1 off): Mistral's and Mixtral's every layer, Gemma 3's local
    layers, each query over its last 4 keys; logits and a training step's
    gradients against transformers, and the numpy reference."""
    from test_training import gradients
    config = dict(PRESETS[preset], sliding_window=4)
    path = config_file(tmp_path, config)
    model = Model(str(tmp_path / "parax"), path, seq=16)
    hf, expected = transformers_logits(tmp_path, config, model)
    assert np.abs(model.reference() - expected).max() < TOL
    assert np.abs(model.run(model.compile("single"), 1) - expected).max() < TOL
    # training: the loss and each gradient
    trained = Model(str(tmp_path / "train"), path, seq=16, loss=True)
    tokens = torch.tensor(trained.tokens, dtype=torch.long)
    logits = hf(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.tensor(trained.labels, dtype=torch.long).reshape(-1))
    loss.backward()
    want = {name: p.grad.numpy() for name, p in hf.named_parameters() if p.grad is not None}
    got_loss, got = gradients(trained, trained.compile("train", autodiff=True), 1)
    assert abs(got_loss - float(loss)) < 1e-5
    for name, grad in got.items():
        if name not in want and "lm_head" in name:
            continue
        w = want[name].reshape(grad.shape)
        assert np.abs(grad - w).max() <= 1e-4 * max(float(np.abs(w).max()), 1e-6), name


def test_gpt2_exact_gelu_matches_transformers(tmp_path):
    """GPT-2 with `activation_function: gelu` (the exact, erf form; GPT-2's
    own is gelu_new, the tanh form): parax's program and the numpy
    reference both against transformers."""
    config = dict(PRESETS["tiny-gpt2"], activation_function="gelu")
    model = Model(str(tmp_path / "parax"), config_file(tmp_path, config), seq=16)
    _, expected = transformers_logits(tmp_path, config, model)
    assert "parax.gelu none" in open(model.ir).read()
    assert np.abs(model.reference() - expected).max() < TOL
    assert np.abs(model.run(model.compile("single"), 1) - expected).max() < TOL


GENERATION_FAMILIES = [("tiny-llama", None), ("tiny-qwen2", None), ("tiny-qwen3", None), ("tiny-mistral", 4),
                       ("tiny-phi3", None), ("tiny-gemma", None), ("tiny-gemma2", 4), ("tiny-gemma3", 4),
                       ("tiny-gpt2", None), ("tiny-mixtral", 4), ("tiny-qwen3-moe", None), ("tiny-deepseek-v3", None)]


@pytest.mark.parametrize("preset,window", GENERATION_FAMILIES, ids=[p[0] for p in GENERATION_FAMILIES])
def test_greedy_generation_is_transformers_generate(tmp_path, preset, window):
    """parax-run --generate against transformers' generate(do_sample=False)
    on the same checkpoint: 2 prompts of 5 tokens, 8 new tokens, every
    family; windows of 4 keys (Mistral, Mixtral: every layer; Gemma 2 and 3:
    the local layers) generate over rings of 3 tokens that wrap 3 times
    (transformers: its own sliding-window caches). The same tokens (neither
    stopping at an end-of-text id), and each new token's logits within TOL
    of transformers'."""
    config = dict(PRESETS[preset], **({"sliding_window": window} if window else {}))
    path = config_file(tmp_path, config)
    step = Model(str(tmp_path / "parax"), path, seq=1, cache=16)
    prompt = np.random.default_rng(5).integers(0, step.cfg.vocab, size=(2, 5))
    tokens, logits = step.generate(step.compile("step"), 1, prompt, 8)
    directory = str(tmp_path / "hf")
    save_pretrained(directory, config, step.weights)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, torch_dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    hf.generation_config.eos_token_id = None  # (parax-run stops only at --stop-token)
    with torch.no_grad():
        out = hf.generate(torch.tensor(prompt, dtype=torch.long), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                          max_new_tokens=8, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    assert (tokens == out.sequences.numpy()).all(), (tokens, out.sequences.numpy())
    expected = np.stack([s.numpy() for s in out.logits], axis=1)  # [rows, 8, V]: each new token's logits
    assert np.abs(logits[:, 4:] - expected).max() < TOL
