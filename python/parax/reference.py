"""An independent numpy implementation of the model families, for the
oracle: it reads Hugging Face tensor names and computes the forward pass the
way the families' papers / reference code define it (not from parax IR).
"""

import math

import numpy as np


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _rope_frequencies(theta, rot, scaling, max_positions, span=0):
    """Inverse frequencies [rot/2] and the factor on cos and sin, as
    transformers' modeling_rope_utils defines each rope_type (`span`: the
    positions of the call, which pick LongRoPE's list)."""
    inv = 1.0 / (theta ** (np.arange(0, rot, 2) / rot))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in ("default", "dynamic"):  # (dynamic: within max_position_embeddings)
        return inv, 1.0
    if kind == "longrope":
        old = scaling["original_max_position_embeddings"]
        factors = np.asarray(scaling["long_factor" if span > old else "short_factor"], float)
        extension = max_positions / old
        amplitude = math.sqrt(1 + math.log(extension) / math.log(old)) if extension > 1 else 1.0
        return inv / factors, amplitude
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        old = scaling["original_max_position_embeddings"]
        low, high = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - scaling["low_freq_factor"]) / (
            scaling["high_freq_factor"] - scaling["low_freq_factor"])
        scaled = np.where(wavelen > low, inv / factor, inv)
        middle = (wavelen <= low) & (wavelen >= high)
        return np.where(middle, (1 - smooth) * inv / factor + smooth * inv, scaled), 1.0
    if kind == "yarn":
        old = scaling.get("original_max_position_embeddings") or max_positions
        fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def dim(rotations):
            return rot * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(math.floor(dim(fast)), 0), min(math.ceil(dim(slow)), rot - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rot // 2) - low) / (high - low), 0, 1)
        kept = 1 - ramp  # the share extrapolated (unscaled)
        if scaling.get("attention_factor") is not None:
            amplitude = float(scaling["attention_factor"])
        elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
            amplitude = ((0.1 * scaling["mscale"] * math.log(factor) + 1)
                         / (0.1 * scaling["mscale_all_dim"] * math.log(factor) + 1))
        else:
            amplitude = 0.1 * math.log(factor) + 1
        return inv / factor * (1 - kept) + inv * kept, amplitude
    raise NotImplementedError(f"numpy reference: rope_type {kind}")


def _rope(x, theta, rot=None, interleaved=False, offset=0, scaling=None, max_positions=0):
    """x: [B, S, H, D] at positions offset .. offset + S - 1; rotate-half
    (Llama) or interleaved pairs; `scaling`: a config's rope_scaling."""
    b, s, h, d = x.shape
    rot = rot or d
    inv, amplitude = _rope_frequencies(theta, rot, scaling, max_positions, offset + s)
    angles = np.arange(offset, offset + s)[:, None] * inv[None, :]  # [S, rot/2]
    cos, sin = np.cos(angles)[None, :, None, :], np.sin(angles)[None, :, None, :]
    cos, sin = cos * amplitude, sin * amplitude
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
        out[..., 0:rot:2] = x1 * cos - x2 * sin
        out[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., : rot // 2], x[..., rot // 2: rot]
        out[..., : rot // 2] = x1 * cos - x2 * sin
        out[..., rot // 2: rot] = x2 * cos + x1 * sin
    return out


def _attention(q, k, v, scale, causal=True, window=0, softcap=0.0):
    """q [B,S,H,D], k/v [B,T,KH,D] (T >= S: the last S keys are the queries'
    own positions): grouped-query, causal softmax attention; with `window`,
    over each query's last `window` keys (its own included)."""
    h, kh = q.shape[2], k.shape[2]
    k = np.repeat(k, h // kh, axis=2)
    v = np.repeat(v, h // kh, axis=2)
    scores = np.einsum("bshd,bthd->bhst", q, k) * scale
    if softcap:  # Gemma 2: c * tanh(s / c)
        scores = softcap * np.tanh(scores / softcap)
    if causal:
        s, t = q.shape[1], k.shape[1]
        seen = np.tril(np.ones((s, t), bool), t - s)
        if window:  # (key j hidden from query i at position i + t - s when j <= i + t - s - window)
            seen &= ~np.tril(np.ones((s, t), bool), t - s - window)
        scores = np.where(seen[None, None], scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", p, v)


def _moe(cfg, w, prefix, x, names, routers=None):
    """Routed experts, each family's rule; x [T, H]. `routers`, if given,
    gets each call's (scores [T, E], chosen experts [T, k])."""
    gate = w[f"{prefix}.gate.weight"]
    logits = x @ gate.T
    if cfg.score_func == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    choice = scores + w.get(f"{prefix}.gate.e_score_correction_bias", 0.0)
    if cfg.num_groups > 1:
        per = cfg.num_experts // cfg.num_groups
        grouped = choice.reshape(len(x), cfg.num_groups, per)
        top2 = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
        keep = np.argsort(-top2, axis=-1, kind="stable")[:, : cfg.topk_groups]
        mask = np.zeros((len(x), cfg.num_groups), bool)
        np.put_along_axis(mask, keep, True, axis=1)
        choice = np.where(np.repeat(mask, per, axis=1), choice, -np.inf)
    top = np.argsort(-choice, axis=-1, kind="stable")[:, : cfg.top_k]
    if routers is not None:
        routers.append((scores, top))
    weights = np.take_along_axis(scores, top, axis=-1)
    if cfg.normalize_topk:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    weights = weights * cfg.routed_scaling
    out = np.zeros_like(x)
    for t in range(len(x)):
        for j in range(cfg.top_k):
            e = top[t, j]
            g = x[t] @ w[f"{prefix}.experts.{e}.{names[0]}.weight"].T
            u = x[t] @ w[f"{prefix}.experts.{e}.{names[1]}.weight"].T
            out[t] += weights[t, j] * ((_silu(g) * u) @ w[f"{prefix}.experts.{e}.{names[2]}.weight"].T)
    return out


def _mlp(w, prefix, x, names=("gate_proj", "up_proj", "down_proj")):
    g = x @ w[f"{prefix}.{names[0]}.weight"].T
    u = x @ w[f"{prefix}.{names[1]}.weight"].T
    return (_silu(g) * u) @ w[f"{prefix}.{names[2]}.weight"].T


class KVCache:
    """Keys (after RoPE) and values of the tokens seen so far, per layer, as
    each layer's attention reads them: `keys[i]`, `values[i]` [B, T, KH, D].
    `latent`: DeepSeek-V3's layers keep what the weight-absorbed form's
    attention reads instead, one KV head of [latent, rope key] keys whose
    latent channels are the values (no `values[i]`; the reference still
    attends in the explicit form, expanding the latents per head)."""

    def __init__(self, latent=False):
        self.keys, self.values = {}, {}
        self.latent = latent

    def append(self, layer, k, v=None):
        """The layer's cached keys and values with k's and v's after them
        (v None: keys alone)."""
        if layer in self.keys:
            k = np.concatenate([self.keys[layer], k], axis=1)
            if v is not None:
                v = np.concatenate([self.values[layer], v], axis=1)
        self.keys[layer] = k
        if v is not None:
            self.values[layer] = v
        return k, v

    def length(self):
        return next(iter(self.keys.values())).shape[1] if self.keys else 0

    def attend(self, layer, q, k, v, scale, window=0, softcap=0.0):
        """Attention of q over the cached tokens and k/v's, which are then cached."""
        k, v = self.append(layer, k, v)
        return _attention(q, k, v, scale, window=window, softcap=softcap)


def balanced_router_bias(cfg, w, tokens):
    """Weights `w` with each MoE layer's e_score_correction_bias set as
    DeepSeek-V3's auxiliary-loss-free balancing drives it, for `tokens`:
    one minus each expert's mean score, so that no expert (and no group) is
    everyone's choice, and which experts and groups a token takes turns on
    the token. Random weights otherwise route most tokens alike, which
    tests no routing rule. Layer by layer (a layer's routing moves the
    next's inputs)."""
    w = dict(w)
    for layer in range(cfg.layers):
        name = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        if name not in w:
            continue
        routers = []
        forward(cfg, w, tokens, routers=routers)
        # (the routers of the MoE layers so far, in order: this one's is the last)
        scores = routers[sum(f"model.layers.{j}.mlp.gate.e_score_correction_bias" in w
                             for j in range(layer + 1)) - 1][0]
        # (plus 1: every score + bias positive, which changes no choice --
        # a common offset moves every expert and group alike -- and keeps
        # transformers' DeepSeek-V3, which masks the groups left out with
        # 0 rather than -inf, choosing as DeepSeek's reference code does)
        w[name] = (1.0 - scores.mean(axis=0)).astype(np.float32)
    return w


def forward(cfg, w, tokens, cache=None, routers=None, trunk=None):
    """Logits [B, S, V] of the model `cfg` with weights `w` on `tokens`.

    With a `KVCache`, `tokens` follow the cached ones (positions from the
    cache's length on) and their keys and values are added to it. `routers`,
    if given, gets every MoE layer's (scores, chosen experts); `trunk`, if
    given, the last layer's hidden states (before the final norm)."""
    cache = cache if cache is not None else KVCache()
    if cfg.family == "gpt2":
        return _gpt2(cfg, w, tokens, cache)
    if cfg.family in ("gemma", "gemma2", "gemma3_text"):
        return _gemma(cfg, w, tokens, cache)
    if cfg.family not in ("llama", "qwen2", "qwen3", "mistral", "phi3", "mixtral", "qwen2_moe",
                          "qwen3_moe", "deepseek_v3"):
        raise NotImplementedError(f"numpy reference: {cfg.family}")
    past = cache.length()
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg.layers):
        h = _decoder_layer(cfg, w, i, h, cache, past, routers)
    if trunk is not None:
        trunk.append(h)
    return _rms_norm(h, w["model.norm.weight"], cfg.norm_eps) @ _head(cfg, w).T


def _gemma(cfg, w, tokens, cache):
    """Gemma (transformers' modeling_gemma) and Gemma 3's text model
    (modeling_gemma3): embeddings times sqrt(hidden) (in f32), RMSNorms
    scaling by 1 + w, a GeGLU MLP (GELU, exact or its tanh form). Gemma 3
    also: each branch normalised before and after, q and k normalised per
    head, scores scaled by query_pre_attn_scalar^-1/2, and every layer but
    each sliding_window_pattern-th local: the rope of
    rope_local_base_freq, unscaled (programs within the window)."""
    gemma3 = cfg.family == "gemma3_text"
    sandwich = cfg.family in ("gemma2", "gemma3_text")
    def norm(x, name):
        return _rms_norm(x, 1.0 + w[name], cfg.norm_eps)
    past = cache.length()
    h = w["model.embed_tokens.weight"][tokens] * np.float32(math.sqrt(cfg.hidden))
    b, s, _ = h.shape
    nh, kh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        local = cfg.window_pattern > 1 and (i + 1) % cfg.window_pattern != 0
        x = norm(h, f"{p}.input_layernorm.weight")
        q = (x @ w[f"{p}.self_attn.q_proj.weight"].T).reshape(b, s, nh, hd)
        k = (x @ w[f"{p}.self_attn.k_proj.weight"].T).reshape(b, s, kh, hd)
        v = (x @ w[f"{p}.self_attn.v_proj.weight"].T).reshape(b, s, kh, hd)
        if gemma3:
            q, k = norm(q, f"{p}.self_attn.q_norm.weight"), norm(k, f"{p}.self_attn.k_norm.weight")
        local_rope = local and gemma3  # (Gemma 3's local layers: their own theta, unscaled)
        rope = dict(rot=hd, offset=past, scaling=None if local_rope else cfg.rope_scaling,
                    max_positions=cfg.max_positions)
        theta = cfg.local_rope_theta if local_rope else cfg.rope_theta
        q, k = _rope(q, theta, **rope), _rope(k, theta, **rope)
        o = cache.attend(i, q, k, v, (cfg.query_scalar or hd) ** -0.5,
                         cfg.sliding_window if local else 0, cfg.attn_softcap).reshape(b, s, nh * hd)
        o = o @ w[f"{p}.self_attn.o_proj.weight"].T
        h = h + (norm(o, f"{p}.post_attention_layernorm.weight") if sandwich else o)
        x = norm(h, f"{p}.pre_feedforward_layernorm.weight" if sandwich else f"{p}.post_attention_layernorm.weight")
        g, u = x @ w[f"{p}.mlp.gate_proj.weight"].T, x @ w[f"{p}.mlp.up_proj.weight"].T
        act = _gelu_tanh(g) if cfg.mlp_act == "gelu_tanh" else 0.5 * g * (1 + _erf(g / math.sqrt(2)))
        m = (act * u) @ w[f"{p}.mlp.down_proj.weight"].T
        h = h + (norm(m, f"{p}.post_feedforward_layernorm.weight") if sandwich else m)
    logits = norm(h, "model.norm.weight") @ _head(cfg, w).T
    if cfg.final_softcap:  # Gemma 2
        logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
    return logits


def _head(cfg, w):
    return w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]


def _decoder_layer(cfg, w, i, h, cache, past, routers):
    """Layer i (model.layers.i) of a pre-norm RMSNorm decoder on h [B, S, H]."""
    b, s, _ = h.shape
    p = f"model.layers.{i}"
    nh, kh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    x = _rms_norm(h, w[f"{p}.input_layernorm.weight"], cfg.norm_eps)
    if cfg.family == "deepseek_v3":
        h = h + _mla(cfg, w, f"{p}.self_attn", x, cache, i, past)
    else:
        def proj(name, n):
            if cfg.fused:  # Phi-3's qkv_proj: q, k, v rows
                rows = {"q_proj": (0, nh * hd), "k_proj": (nh * hd, kh * hd),
                        "v_proj": ((nh + kh) * hd, kh * hd)}[name]
                fused = w[f"{p}.self_attn.qkv_proj.weight"]
                return (x @ fused[rows[0]: rows[0] + rows[1]].T).reshape(b, s, n, hd)
            y = x @ w[f"{p}.self_attn.{name}.weight"].T
            if cfg.attention_bias:
                y = y + w[f"{p}.self_attn.{name}.bias"]
            return y.reshape(b, s, n, hd)
        q, k = proj("q_proj", nh), proj("k_proj", kh)
        if cfg.qk_norm:
            q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], cfg.norm_eps)
            k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], cfg.norm_eps)
        scaling = cfg.rope_scaling
        if (scaling or {}).get("rope_type") == "longrope":
            scaling = dict(scaling, original_max_position_embeddings=cfg.original_max_positions)
        rope = dict(rot=cfg.rotary_dim or hd, offset=past, scaling=scaling,
                    max_positions=cfg.max_positions)
        q, k = _rope(q, cfg.rope_theta, **rope), _rope(k, cfg.rope_theta, **rope)
        v = proj("v_proj", kh)
        window = cfg.sliding_window if cfg.family in ("mistral", "mixtral") else 0
        o = cache.attend(i, q, k, v, 1.0 / math.sqrt(hd), window).reshape(b, s, nh * hd)
        h = h + o @ w[f"{p}.self_attn.o_proj.weight"].T
    x = _rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], cfg.norm_eps)
    flat = x.reshape(b * s, -1)
    if cfg.fused:  # Phi-3's gate_up_proj: gate rows, then up rows
        gate, up = np.split(w[f"{p}.mlp.gate_up_proj.weight"], 2, axis=0)
        m = (_silu(flat @ gate.T) * (flat @ up.T)) @ w[f"{p}.mlp.down_proj.weight"].T
    elif not cfg.is_moe_layer(i):
        m = _mlp(w, f"{p}.mlp", flat)
    elif cfg.family == "mixtral":
        m = _moe(cfg, w, f"{p}.block_sparse_moe", flat, ("w1", "w3", "w2"), routers)
    elif cfg.family == "deepseek_v3":
        m = _moe(cfg, w, f"{p}.mlp", flat, ("gate_proj", "up_proj", "down_proj"), routers)
        m = m + _mlp(w, f"{p}.mlp.shared_experts", flat)
    else:  # Qwen2-MoE (a gated shared expert), Qwen3-MoE (none)
        m = _moe(cfg, w, f"{p}.mlp", flat, ("gate_proj", "up_proj", "down_proj"), routers)
        if cfg.shared_ffn:
            shared = _mlp(w, f"{p}.mlp.shared_expert", flat)
            gate = 1.0 / (1.0 + np.exp(-(flat @ w[f"{p}.mlp.shared_expert_gate.weight"].T)))
            m = m + gate * shared
    return h + m.reshape(b, s, -1)


def multi_token_prediction(cfg, w, tokens, labels, trunk, depths, ignore_index=-100, routers=None):
    """DeepSeek-V3's multi-token prediction losses (report §2.2, eqs. 21-24),
    one per depth k = 1..depths: the previous depth's hidden states (the
    `trunk`'s, before the final norm, first) and the embedding of the
    tokens k ahead, each RMS-normalised, joined (the embedding's first, as
    the checkpoint's eh_proj reads them) and projected, through decoder
    layer L + k - 1, its shared_head norm and the output head; the mean
    cross-entropy against the labels k ahead over the positions that have
    one (and are not `ignore_index`)."""
    b, s = tokens.shape
    h, losses = trunk, []
    for k in range(1, depths + 1):
        i = cfg.layers + k - 1
        p = f"model.layers.{i}"
        ahead = np.zeros_like(tokens)
        ahead[:, : s - k] = tokens[:, k:]
        e = _rms_norm(w["model.embed_tokens.weight"][ahead], w[f"{p}.enorm.weight"], cfg.norm_eps)
        x = np.concatenate([e, _rms_norm(h, w[f"{p}.hnorm.weight"], cfg.norm_eps)], axis=-1)
        h = _decoder_layer(cfg, w, i, x @ w[f"{p}.eh_proj.weight"].T, KVCache(), 0, routers)
        logits = (_rms_norm(h, w[f"{p}.shared_head.norm.weight"], cfg.norm_eps) @ _head(cfg, w).T)
        target = np.full_like(labels, ignore_index)
        target[:, : s - k] = labels[:, k:]
        losses.append(cross_entropy(logits, target, ignore_index))
    return losses


def cross_entropy(logits, labels, ignore_index=None):
    """The mean token cross-entropy of `logits` [.., V] against `labels`
    (float64), over the labels that are not `ignore_index` (none: 0)."""
    counted = labels != ignore_index if ignore_index is not None else np.ones(labels.shape, bool)
    logits = logits.astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, np.where(counted, labels, 0)[..., None].astype(np.int64), axis=-1)[..., 0]
    return float(-picked[counted].mean()) if counted.any() else 0.0


def _gpt2(cfg, w, tokens, cache):
    b, s = tokens.shape
    p, past = "transformer", cache.length()
    h = w[f"{p}.wte.weight"][tokens] + w[f"{p}.wpe.weight"][past:past + s][None]
    nh, hd = cfg.heads, cfg.head_dim
    for i in range(cfg.layers):
        q = f"{p}.h.{i}"
        x = _layer_norm(h, w[f"{q}.ln_1.weight"], w[f"{q}.ln_1.bias"], cfg.norm_eps)
        qkv = x @ w[f"{q}.attn.c_attn.weight"] + w[f"{q}.attn.c_attn.bias"]
        qq, kk, vv = np.split(qkv, 3, axis=-1)
        shape = (b, s, nh, hd)
        o = cache.attend(i, qq.reshape(shape), kk.reshape(shape), vv.reshape(shape),
                         1.0 / math.sqrt(hd)).reshape(b, s, -1)
        h = h + o @ w[f"{q}.attn.c_proj.weight"] + w[f"{q}.attn.c_proj.bias"]
        x = _layer_norm(h, w[f"{q}.ln_2.weight"], w[f"{q}.ln_2.bias"], cfg.norm_eps)
        f = x @ w[f"{q}.mlp.c_fc.weight"] + w[f"{q}.mlp.c_fc.bias"]
        f = _gelu_tanh(f) if cfg.gelu_approx == "tanh" else 0.5 * f * (1 + _erf(f / math.sqrt(2)))
        h = h + f @ w[f"{q}.mlp.c_proj.weight"] + w[f"{q}.mlp.c_proj.bias"]
    x = _layer_norm(h, w[f"{p}.ln_f.weight"], w[f"{p}.ln_f.bias"], cfg.norm_eps)
    return x @ w[f"{p}.wte.weight"].T


def _mla(cfg, w, p, x, cache, layer, past):
    """DeepSeek-V3 multi-head latent attention (explicit form), x [B, S, H]
    at positions past ..; the cache holds the expanded per-head keys and values."""
    b, s, _ = x.shape
    nh, nope, rope_d, vd = cfg.heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    if cfg.q_lora_rank:
        q = _rms_norm(x @ w[f"{p}.q_a_proj.weight"].T, w[f"{p}.q_a_layernorm.weight"],
                      cfg.norm_eps) @ w[f"{p}.q_b_proj.weight"].T
    else:
        q = x @ w[f"{p}.q_proj.weight"].T
    q = q.reshape(b, s, nh, nope + rope_d)
    rope = dict(interleaved=True, offset=past, scaling=cfg.rope_scaling, max_positions=cfg.max_positions)
    q_nope, q_pe = q[..., :nope], _rope(q[..., nope:], cfg.rope_theta, **rope)
    ckv = x @ w[f"{p}.kv_a_proj_with_mqa.weight"].T
    latent, k_pe = ckv[..., : cfg.kv_lora_rank], ckv[..., cfg.kv_lora_rank:]
    k_pe = _rope(k_pe.reshape(b, s, 1, rope_d), cfg.rope_theta, **rope)
    latent = _rms_norm(latent, w[f"{p}.kv_a_layernorm.weight"], cfg.norm_eps)
    qf = np.concatenate([q_nope, q_pe], axis=-1)
    scale = 1.0 / math.sqrt(nope + rope_d)
    scaling = cfg.rope_scaling or {}
    if scaling.get("mscale_all_dim") and float(scaling.get("factor", 1)) > 1:
        # DeepSeek-V3's YaRN: the softmax scale times mscale(all dims) squared
        scale *= (0.1 * scaling["mscale_all_dim"] * math.log(float(scaling["factor"])) + 1) ** 2
    if cache.latent:  # cache [latent, rope key] and the latent; expand them all
        keys, _ = cache.append(layer, np.concatenate([latent[:, :, None], k_pe], axis=-1))
        latent, k_pe = keys[:, :, 0, :cfg.kv_lora_rank], keys[:, :, :, cfg.kv_lora_rank:]
    t = latent.shape[1]
    kv = (latent @ w[f"{p}.kv_b_proj.weight"].T).reshape(b, t, nh, nope + vd)
    k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe, (b, t, nh, rope_d))], axis=-1)
    v = kv[..., nope:]
    if cache.latent:
        o = _attention(qf, k, v, scale)
    else:
        o = cache.attend(layer, qf, k, v, scale)
    return o.reshape(b, s, nh * vd) @ w[f"{p}.o_proj.weight"].T


def load_balancing_loss(cfg, routers, sequences=1):
    """The MoE load-balancing loss of a forward pass's routers (`forward`'s
    `routers`) as transformers' `load_balancing_loss_func` computes it for
    Mixtral and Qwen2-MoE: every layer's tokens together,
    cfg.router_aux_loss_coef · E · Σ_e f_e · P_e, f_e the choices routed to
    e over all the rows (layers × tokens), P_e the mean score. With
    cfg.sequence_aux, DeepSeek-V3's sequence-wise loss instead (its §2.1.2,
    eqs. 17-20, over the batch's `sequences` rows, each layer's own)."""
    if cfg.sequence_aux:
        return sequence_balance_loss(cfg, routers, sequences)
    counts = sum(np.bincount(top.reshape(-1), minlength=cfg.num_experts) for _, top in routers)
    rows = sum(len(scores) for scores, _ in routers)
    mean_score = sum(scores.sum(axis=0) for scores, _ in routers) / rows
    return cfg.router_aux_loss_coef * cfg.num_experts * float((counts / rows * mean_score).sum())


def sequence_balance_loss(cfg, routers, sequences):
    """DeepSeek-V3's complementary sequence-wise balance loss, summed over
    the layers: for each sequence of T tokens, α · Σ_i f_i · P_i with f_i =
    N_r / (K_r · T) · (the tokens whose top-K holds i) and P_i = (1 / T) Σ_t
    s_i,t / Σ_j s_j,t, averaged over the sequences (as DeepSeek-V2's
    modeling code averages its seq_aux loss over the batch)."""
    total = 0.0
    E, K = cfg.num_experts, cfg.top_k
    for scores, top in routers:
        s = scores.reshape(sequences, -1, E).astype(np.float64)
        T = s.shape[1]
        chosen = np.zeros_like(s)
        np.put_along_axis(chosen, top.reshape(sequences, T, K), 1.0, axis=-1)
        f = chosen.sum(axis=1) * E / (K * T)
        p = (s / s.sum(axis=-1, keepdims=True)).mean(axis=1)
        total += cfg.router_aux_loss_coef * float((f * p).sum(axis=-1).mean())
    return total
