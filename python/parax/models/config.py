"""Model configs: the fields of a Hugging Face `config.json`, normalised."""

import copy
import dataclasses
import json
import math
import os
from typing import Optional

from .presets import PRESETS

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2", "gemma3_text", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe",
            "deepseek_v3")


class ConfigError(ValueError):
    """A config that names no known family, lacks a required field, or sets
    a field parax does not implement."""


# Fields of a Hugging Face config.json that leave the model parax builds
# unchanged whatever their value: bookkeeping, tokens, generation defaults,
# initialisation, and dropout (parax runs none: as transformers' eval()).
NEUTRAL_FIELDS = frozenset({
    "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "attn_implementation",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "initializer_range", "initializer_factor", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "use_bfloat16", "tokenizer_class", "id2label", "label2id",
    "problem_type", "finetuning_task", "task_specific_params", "prefix", "tf_legacy_loss",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "chunk_size_feed_forward",
    # dropout (training regularisation; none in parax, as in eval mode)
    "attention_dropout", "hidden_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop",
    "summary_first_dropout",
    # GPT-2's sequence-classification head (not the causal LM)
    "summary_activation", "summary_proj_to_labels", "summary_type", "summary_use_proj",
    # the same math, computed in another order or precision
    "pretraining_tp", "reorder_and_upcast_attn",
    # DeepSeek-V3: the expert-parallel degree its reference code ran
    "ep_size",
    # Gemma 3: the KV cache transformers' generate() builds
    "cache_implementation",
})


class _Fields(dict):
    """A config dictionary that remembers the fields read from it."""

    def __init__(self, raw):
        super().__init__(raw)
        self.read = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def _only(raw, family, key, allowed, default, builds):
    """The field's value, refused unless it is one of `allowed` (what parax
    builds: `builds`)."""
    value = raw.get(key, default)
    if value not in allowed:
        raise ConfigError(f"{family} config field '{key}' = {value!r} is not implemented "
                          f"(parax builds {builds}); refusing the model rather than building "
                          f"another one")
    return value


@dataclasses.dataclass
class ModelConfig:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int                      # dense MLP width (intermediate_size)
    vocab: int
    max_positions: int
    norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections with biases (Qwen2's, Qwen2-MoE's)
    qk_norm: bool = False         # Qwen3: an RMSNorm over each head's q and k before rotary
    fused: bool = False           # Phi-3: one qkv_proj and one gate_up_proj tensor
    rotary_dim: int = 0           # channels a head rotates (0: all; Phi's partial_rotary_factor)
    # Phi-3's original_max_position_embeddings: where LongRoPE switches from
    # its short to its long factors (0: none)
    original_max_positions: int = 0
    # Attention over the last `sliding_window` tokens alone (Mistral's,
    # Mixtral's, Qwen2's with use_sliding_window; 0: every earlier one):
    # a program that spans more tokens is refused at build.
    sliding_window: int = 0
    # The window applied as the attention's mask (`window`, Mistral's,
    # Mixtral's, Gemma 3's local layers'): programs may span more
    window_masked: bool = False
    gelu_approx: str = "tanh"     # GPT-2 family: "tanh" (gelu_new) or "none"
    # mixture of experts
    num_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0           # width of the shared expert(s); 0 = none
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate on the shared expert
    normalize_topk: bool = False
    score_func: str = "softmax"
    routed_scaling: float = 1.0
    num_groups: int = 1
    topk_groups: int = 1
    first_dense_layers: int = 0   # DeepSeek: the first k layers use a dense MLP
    router_bias: bool = False     # DeepSeek-V3: e_score_correction_bias
    # the load-balancing loss's weight in training (Hugging Face's
    # router_aux_loss_coef, taken when output_router_logits is set;
    # DeepSeek's aux_loss_alpha)
    router_aux_loss_coef: float = 0.0
    # DeepSeek-V3's sequence-wise balance loss (seq_aux): per layer and
    # sequence, not over every layer's tokens together
    sequence_aux: bool = False
    # multi-token prediction's depths (DeepSeek-V3's num_nextn_predict_layers;
    # built only for a loss given its weight)
    mtp_layers: int = 0
    # multi-head latent attention (DeepSeek-V3)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # Gemma 3: RMSNorms scaling by (offset + w) (1: Gemma's 1 + w), the
    # embeddings scaled by sqrt(hidden), a GeGLU MLP (GELU, tanh form),
    # norms after attention and the MLP too (sandwich), scores scaled by
    # query_pre_attn_scalar^-1/2, and local layers (all but each
    # `window_pattern`-th) over a sliding window with their own rope theta
    # and no rope scaling
    norm_offset: float = 0.0
    embed_scale: bool = False
    mlp_act: str = "silu"
    sandwich_norms: bool = False
    query_scalar: float = 0.0
    local_rope_theta: float = 0.0
    window_pattern: int = 0
    # Gemma 2: scores and final logits soft-capped, c · tanh(x / c) (0: none)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    name: str = "model"

    def layer_window(self, layer):
        """The sliding window layer `layer`'s attention applies (0: none)."""
        if not self.window_masked or not self.sliding_window:
            return 0
        if self.family in ("gemma2", "gemma3_text"):
            return self.sliding_window if self.is_local_layer(layer) else 0
        return self.sliding_window

    def is_local_layer(self, layer):
        """Gemma 3's sliding-window layers (transformers: (i + 1) % pattern)."""
        return self.window_pattern > 1 and (layer + 1) % self.window_pattern != 0

    @property
    def is_moe(self):
        return self.num_experts > 0

    def is_moe_layer(self, layer):
        return self.is_moe and layer >= self.first_dense_layers


def _rope_kind(scaling, family):
    """A rope_scaling's kind; Phi-3's 'su' and 'yarn' are LongRoPE (as
    transformers' Phi3Config reads them)."""
    kind = scaling.get("rope_type", scaling.get("type"))
    return "longrope" if family == "phi3" and kind in ("su", "yarn") else kind


def _scaling_or_none(scaling, family):
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        return None
    if _rope_kind(scaling, family) == "longrope":
        return {"rope_type": "longrope", "short_factor": list(scaling["short_factor"]),
                "long_factor": list(scaling["long_factor"])}
    if scaling.get("rope_type", scaling.get("type")) == "dynamic":
        # Dynamic NTK: plain rotary up to max_position_embeddings (a longer
        # program is refused at build: rope_positions)
        return {"rope_type": "dynamic"}
    return copy.deepcopy(dict(scaling))


def _need(raw, *keys):
    for key in keys:
        if key in raw:
            return raw[key]
    raise ConfigError(f"config lacks '{keys[0]}'")


ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def _check_rope_scaling(raw, family):
    """rope_scaling: one of ROPE_TYPES (both runtimes compute its
    frequencies), with the fields each reads; refused otherwise."""
    scaling = raw.get("rope_scaling")
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ConfigError(f"{family} config field 'rope_scaling' = {scaling!r} is not a dictionary")
    kind = _rope_kind(scaling, family)
    if family == "phi3" and kind not in ("default", "longrope"):
        raise ConfigError(f"phi3 config field 'rope_scaling' has rope_type {kind!r}: a Phi-3 "
                          f"config takes LongRoPE alone ('longrope', or 'su' and 'yarn', which "
                          f"transformers reads as it)")
    if kind == "longrope":
        if family != "phi3":
            raise ConfigError(f"{family} config field 'rope_scaling': LongRoPE is implemented for "
                              f"phi3 alone")
        extra = sorted(set(scaling) - {"rope_type", "type", "short_factor", "long_factor"})
        if extra:
            raise ConfigError(f"phi3 config field 'rope_scaling' (longrope) has "
                              f"{', '.join(map(repr, extra))}: not implemented (a Phi-3 config's "
                              f"LongRoPE has type, short_factor and long_factor)")
        for key in ("short_factor", "long_factor"):
            values = scaling.get(key)
            if not isinstance(values, list) or not values or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    and v > 0 for v in values):
                raise ConfigError(f"phi3 config field 'rope_scaling' (longrope) needs '{key}', a "
                                  f"list of positive numbers, got {values!r}")
        return
    if kind not in ROPE_TYPES:
        raise ConfigError(f"{family} config field 'rope_scaling' has rope_type {kind!r}, which is "
                          f"not implemented (implemented: {', '.join(ROPE_TYPES)})")
    known = {"rope_type", "type", "factor", "original_max_position_embeddings", "low_freq_factor",
             "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor"}
    extra = sorted(set(scaling) - known)
    if extra:
        raise ConfigError(f"{family} config field 'rope_scaling' has {', '.join(map(repr, extra))}, "
                          f"unknown to parax (rope_type {kind!r})")
    if kind != "default" and not float(scaling.get("factor", 0)) > 0:
        raise ConfigError(f"{family} config field 'rope_scaling' needs a positive 'factor' "
                          f"(rope_type {kind!r})")
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in scaling:
                raise ConfigError(f"{family} config field 'rope_scaling' (llama3) lacks '{key}'")
    if kind == "yarn" and family == "deepseek_v3" and abs(yarn_attention_factor(scaling) - 1) > 1e-12:
        raise ConfigError(f"deepseek_v3 config field 'rope_scaling': YaRN with mscale "
                          f"{scaling.get('mscale')!r} unlike mscale_all_dim "
                          f"{scaling.get('mscale_all_dim')!r} (a factor on the rotated channels "
                          f"alone) is not implemented")


def longrope_attention_factor(cfg):
    """LongRoPE's factor on cos and sin (transformers'
    _compute_longrope_parameters): sqrt(1 + ln s / ln L), s the context's
    extension max_position_embeddings / L, L the original context; 1 when
    it is not extended."""
    extension = cfg.max_positions / cfg.original_max_positions
    if extension <= 1:
        return 1.0
    return math.sqrt(1 + math.log(extension) / math.log(cfg.original_max_positions))


def yarn_attention_factor(scaling):
    """YaRN's factor on cos and sin (transformers' `attention_factor`): the
    given one, else DeepSeek's mscale ratio, else 0.1 ln(factor) + 1."""
    def mscale(factor, m=1.0):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    factor = float(scaling["factor"])
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(factor, float(scaling["mscale"])) / mscale(factor, float(scaling["mscale_all_dim"]))
    return mscale(factor)


def from_hf_dict(raw, name="model", allow_unknown=()):
    """Builds a ModelConfig from a Hugging Face config dictionary. Every
    field is used, known to leave the math unchanged (NEUTRAL_FIELDS), or
    refused: a value parax does not implement, or a field it does not know
    (unless named in `allow_unknown`, the user's word that it changes
    nothing)."""
    raw = _Fields(raw)
    cfg = _from_fields(raw, name)
    unknown = sorted(k for k in raw if k not in raw.read and k not in NEUTRAL_FIELDS
                     and k not in allow_unknown)
    if unknown:
        listed = ", ".join(f"'{k}' = {dict.__getitem__(raw, k)!r}" for k in unknown)
        raise ConfigError(f"{cfg.family} config field(s) {listed} unknown to parax: they may "
                          f"change the model, which parax would then build wrongly; if they do "
                          f"not, pass --allow-unknown-config for each")
    return cfg


def _from_fields(raw, name):
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(
            f"model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})")
    _check_rope_scaling(raw, family)
    if family == "gpt2":
        # the attention scaled by 1/sqrt(head dim) only, no cross-attention
        _only(raw, family, "scale_attn_weights", (True,), True, "scores scaled by 1/sqrt(head dim)")
        _only(raw, family, "scale_attn_by_inverse_layer_idx", (False,), False,
              "no per-layer attention scale")
        _only(raw, family, "add_cross_attention", (False,), False, "a decoder without cross-attention")
        raw.get("n_ctx")  # (an old alias of n_positions, which is read)
        hidden = _need(raw, "n_embd", "hidden_size")
        heads = _need(raw, "n_head", "num_attention_heads")
        if hidden % heads:
            raise ConfigError(f"n_embd {hidden} is not divisible by n_head {heads}")
        act = raw.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh"):
            raise ConfigError(f"activation_function {act!r} is not supported")
        return ModelConfig(
            family=family, name=name, hidden=hidden,
            layers=_need(raw, "n_layer", "num_hidden_layers"), heads=heads,
            kv_heads=heads, head_dim=hidden // heads,
            ffn=raw.get("n_inner") or 4 * hidden, vocab=_need(raw, "vocab_size"),
            max_positions=_need(raw, "n_positions", "max_position_embeddings"),
            norm_eps=raw.get("layer_norm_epsilon", 1e-5), tie_embeddings=True,
            attention_bias=True, gelu_approx="none" if act == "gelu" else "tanh")

    if family in ("gemma", "gemma2", "gemma3_text"):
        return _gemma(raw, family, name)
    # Every other family: a SwiGLU MLP, RMSNorm, no bias but where the
    # family has its own (Qwen2-MoE's q/k/v).
    _only(raw, family, "hidden_act", ("silu",), "silu", "SiLU (SwiGLU)")
    _only(raw, family, "mlp_bias", (False,), False, "MLPs without biases")
    if family in ("llama", "mistral", "qwen3", "qwen3_moe", "phi3"):
        _only(raw, family, "attention_bias", (False,), False,
              "attention projections without biases")
    hidden = _need(raw, "hidden_size")
    heads = _need(raw, "num_attention_heads")
    max_positions = raw.get("max_position_embeddings", 4096)
    window = 0
    if family in ("mistral", "mixtral", "phi3"):  # (transformers' defaults: 4096, None, None)
        window = raw.get("sliding_window", 4096 if family == "mistral" else None) or 0
    original = 0
    if family == "phi3":  # (transformers' default: 4096)
        original = int(raw.get("original_max_position_embeddings", 4096))
    if family == "mixtral":
        _only(raw, family, "router_jitter_noise", (0, 0.0), 0.0, "routing without jitter noise")
    if family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # transformers slides the window over the layers from
        # max_window_layers on (none when it is the layer count)
        if raw.get("use_sliding_window", False) and \
                raw.get("max_window_layers", 28) < _need(raw, "num_hidden_layers"):
            window = raw.get("sliding_window", 4096) or 0
        raw.get("sliding_window"), raw.get("max_window_layers")  # (unused without it)
    if family == "qwen2_moe":
        _only(raw, family, "qkv_bias", (True,), True, "q/k/v projections with biases")
    if family == "deepseek_v3":
        _only(raw, family, "moe_layer_freq", (1,), 1, "experts in every layer after the first dense ones")
        _only(raw, family, "topk_method", ("noaux_tc", "greedy"), "noaux_tc",
              "DeepSeek-V3's group-limited routing (noaux_tc) or plain top-k")
        _only(raw, family, "rope_interleave", (True,), True, "interleaved rotary channels")
    cfg = ModelConfig(
        family=family, name=name, hidden=hidden,
        layers=_need(raw, "num_hidden_layers"), heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        ffn=_need(raw, "intermediate_size"), vocab=_need(raw, "vocab_size"),
        max_positions=max_positions,
        norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rope_scaling=_scaling_or_none(raw.get("rope_scaling"), family),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=family in ("qwen2", "qwen2_moe") or bool(raw.get("attention_bias", False)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        fused=family == "phi3",
        sliding_window=int(window),
        window_masked=family in ("mistral", "mixtral"),
        original_max_positions=original)
    if family in ("mixtral", "qwen2_moe", "qwen3_moe"):
        # (a training loss transformers adds only with output_router_logits)
        coef = float(raw.get("router_aux_loss_coef", 0.001))
        if raw.get("output_router_logits"):
            cfg.router_aux_loss_coef = coef
    if family == "mixtral":
        cfg.num_experts = _need(raw, "num_local_experts")
        cfg.top_k = _need(raw, "num_experts_per_tok")
        cfg.moe_ffn = cfg.ffn
        cfg.normalize_topk = True
    elif family in ("qwen2_moe", "qwen3_moe"):
        cfg.num_experts = _need(raw, "num_experts")
        cfg.top_k = _need(raw, "num_experts_per_tok")
        cfg.moe_ffn = _need(raw, "moe_intermediate_size")
        if family == "qwen2_moe":  # (Qwen3-MoE has no shared expert)
            cfg.shared_ffn = raw.get("shared_expert_intermediate_size", 0)
            cfg.shared_expert_gate = cfg.shared_ffn > 0
        cfg.normalize_topk = bool(raw.get("norm_topk_prob", family == "qwen3_moe"))
        if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(f"{family}: mlp_only_layers / decoder_sparse_step "
                              "other than every layer are not supported")
    elif family == "deepseek_v3":
        cfg.num_experts = _need(raw, "n_routed_experts")
        cfg.top_k = _need(raw, "num_experts_per_tok")
        cfg.moe_ffn = _need(raw, "moe_intermediate_size")
        cfg.shared_ffn = raw.get("n_shared_experts", 0) * cfg.moe_ffn
        cfg.normalize_topk = bool(raw.get("norm_topk_prob", True))
        cfg.score_func = raw.get("scoring_func", "sigmoid")
        cfg.routed_scaling = float(raw.get("routed_scaling_factor", 1.0))
        cfg.num_groups = raw.get("n_group", 1)
        cfg.topk_groups = raw.get("topk_group", 1)
        cfg.first_dense_layers = raw.get("first_k_dense_replace", 0)
        # The complementary sequence-wise balance loss (DeepSeek-V3 §2.1.2).
        if float(raw.get("aux_loss_alpha", 0.0)) > 0:
            if not raw.get("seq_aux", False):
                raise ConfigError("deepseek_v3: aux_loss_alpha without seq_aux (the batch-wise "
                                  "balance loss) is not supported; set seq_aux")
            cfg.router_aux_loss_coef = float(raw["aux_loss_alpha"])
            cfg.sequence_aux = True
        cfg.router_bias = cfg.score_func == "sigmoid"
        cfg.mtp_layers = int(raw.get("num_nextn_predict_layers", 0) or 0)
        cfg.q_lora_rank = raw.get("q_lora_rank") or 0
        cfg.kv_lora_rank = _need(raw, "kv_lora_rank")
        cfg.qk_nope_dim = _need(raw, "qk_nope_head_dim")
        cfg.qk_rope_dim = _need(raw, "qk_rope_head_dim")
        cfg.v_head_dim = _need(raw, "v_head_dim")
        cfg.head_dim = cfg.qk_nope_dim + cfg.qk_rope_dim
        cfg.kv_heads = heads
    factor = float(raw.get("partial_rotary_factor", 1.0)) if family == "phi3" else 1.0
    cfg.rotary_dim = int(cfg.head_dim * factor)
    if cfg.rotary_dim % 2 or not 0 < cfg.rotary_dim <= cfg.head_dim:
        raise ConfigError(f"{family} config field 'partial_rotary_factor' = {factor!r}: "
                          f"{cfg.rotary_dim} rotated channels of {cfg.head_dim} (an even number "
                          f"is needed)")
    if cfg.rotary_dim < cfg.head_dim and (cfg.rope_scaling or {}).get(
            "rope_type", (cfg.rope_scaling or {}).get("type")) == "yarn":
        raise ConfigError(f"{family} config field 'rope_scaling': YaRN on partially rotated heads "
                          f"(partial_rotary_factor {factor}) is not implemented")
    if (cfg.rope_scaling or {}).get("rope_type") == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(cfg.rope_scaling[key]) != cfg.rotary_dim // 2:
                raise ConfigError(f"phi3 config field 'rope_scaling' (longrope): '{key}' has "
                                  f"{len(cfg.rope_scaling[key])} factors, the rotated channels "
                                  f"need {cfg.rotary_dim // 2} (one a pair)")
        if original <= 0:
            raise ConfigError(f"phi3 config field 'original_max_position_embeddings' = "
                              f"{original!r} must be positive")
    _check_heads(cfg)
    return cfg


def _gemma(raw, family, name):
    """Gemma (`gemma`), Gemma 2 (`gemma2`) and Gemma 3's text model
    (`gemma3_text`), with transformers' defaults for each: Llama with 1 + w
    norms, embeddings scaled by sqrt(hidden) and a GeGLU MLP. Gemma reads
    `hidden_act` (transformers' PyTorch Gemma does; `hidden_activation` is
    its Flax model's). Gemma 2 and 3: each branch normalised before and
    after, scores scaled by query_pre_attn_scalar^-1/2, local layers over
    a sliding window (Gemma 2: every even one; Gemma 3: all but each
    sliding_window_pattern-th, with their own rope theta). Gemma 2 soft-caps
    scores and final logits; Gemma 3 normalises each head's q and k."""
    v2, v3 = family == "gemma2", family == "gemma3_text"
    if family == "gemma":
        act = _only(raw, family, "hidden_act", ("gelu_pytorch_tanh", "gelu"), "gelu_pytorch_tanh",
                    "a GeGLU MLP with GELU, exact or in its tanh form")
        raw.get("hidden_activation")  # (read by transformers' Flax model alone)
    else:
        act = _only(raw, family, "hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh",
                    "a GeGLU MLP with GELU's tanh form")
    _only(raw, family, "attention_bias", (False,), False, "attention projections without biases")
    caps = {"attn_logit_softcapping": 0.0, "final_logit_softcapping": 0.0}
    for key, default in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)):
        if v3:
            _only(raw, family, key, (None,), None, "scores and logits without soft-capping")
        elif v2:
            value = raw.get(key, default)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)
                                          and value > 0):
                raise ConfigError(f"{family} config field '{key}' = {value!r} must be a positive "
                                  f"number or null")
            caps[key] = float(value or 0)
    hidden, heads = _need(raw, "hidden_size"), _need(raw, "num_attention_heads")
    layers = _need(raw, "num_hidden_layers")
    pattern = 2 if v2 else int(raw.get("sliding_window_pattern", 6)) if v3 else 0
    if v3 and pattern < 1:
        raise ConfigError(f"{family} config field 'sliding_window_pattern' = {pattern!r} must be positive")
    window = int(raw.get("sliding_window", 4096) or 0) if v2 or v3 else 0
    theta = float(raw.get("rope_theta", 1e6 if v3 else 10000.0))
    cfg = ModelConfig(
        family=family, name=name, hidden=hidden, layers=layers, heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads, head_dim=raw.get("head_dim", 256),
        ffn=_need(raw, "intermediate_size"), vocab=_need(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 131072 if v3 else 8192),
        norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=theta,
        rope_scaling=_scaling_or_none(raw.get("rope_scaling"), family),
        tie_embeddings=bool(raw.get("tie_word_embeddings", True)), qk_norm=v3,
        sliding_window=window if pattern > 1 and layers > 0 else 0, window_masked=True,
        norm_offset=1.0, embed_scale=True, mlp_act="gelu_tanh" if act == "gelu_pytorch_tanh" else "gelu",
        sandwich_norms=v2 or v3, query_scalar=float(raw.get("query_pre_attn_scalar", 256)) if v2 or v3 else 0.0,
        local_rope_theta=float(raw.get("rope_local_base_freq", 10000.0)) if v3 else theta,
        window_pattern=pattern, attn_softcap=caps["attn_logit_softcapping"],
        final_softcap=caps["final_logit_softcapping"])
    cfg.rotary_dim = cfg.head_dim
    if v3 and (cfg.rope_scaling or {}).get("rope_type") not in (None, "linear"):
        raise ConfigError(f"{family} config field 'rope_scaling' = {raw.get('rope_scaling')!r}: "
                          f"Gemma 3 with a rope scaling other than 'linear' is not implemented")
    if (v2 or v3) and cfg.query_scalar <= 0:
        raise ConfigError(f"{family} config field 'query_pre_attn_scalar' must be positive")
    _check_heads(cfg)
    return cfg


def _check_heads(cfg):
    if cfg.heads % cfg.kv_heads:
        raise ConfigError(f"num_key_value_heads {cfg.kv_heads} does not divide "
                          f"num_attention_heads {cfg.heads}")


def load_config(preset_or_path, layers=None, pad_vocab=None, allow_unknown=()):
    """A preset name, a path to a Hugging Face config.json or a model folder
    holding one -> ModelConfig (a path that exists wins over a preset of its
    name). `allow_unknown`: config fields the user
    vouches leave the model unchanged (from_hf_dict).
    `pad_vocab=M`: the vocabulary rounded up to a multiple of M, as
    Megatron-LM pads it (--make-vocab-size-divisible-by, times its tensor
    parallel degree) so that tensor parallelism divides the embedding and
    the output head: a model of that many classes, the added ones never a
    label (trained towards zero probability), whose checkpoint has as many
    rows (a Hugging Face GPT-2's 50,257 do not: parax-run refuses it)."""
    # (a file or folder of a preset's name is what the user means: a model
    # saved as "tiny-llama" is not the preset tiny-llama)
    if preset_or_path in PRESETS and not os.path.exists(preset_or_path):
        cfg = from_hf_dict(copy.deepcopy(PRESETS[preset_or_path]), preset_or_path)
    elif os.path.isdir(preset_or_path):  # a Hugging Face model folder
        path = os.path.join(preset_or_path, "config.json")
        if not os.path.exists(path):
            raise ConfigError(f"{preset_or_path}: a folder without a config.json")
        return load_config(path, layers, pad_vocab, allow_unknown)
    elif os.path.exists(preset_or_path):
        with open(preset_or_path) as f:
            try:
                raw = json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{preset_or_path}: not valid JSON: {e}") from e
        name = os.path.basename(os.path.dirname(os.path.abspath(preset_or_path)))
        if not isinstance(raw, dict):
            raise ConfigError(f"{preset_or_path}: a config must be a JSON object")
        try:
            cfg = from_hf_dict(raw, name or "model", allow_unknown)
        except ConfigError as e:
            raise ConfigError(f"{preset_or_path}: {e}") from e
    else:
        raise ConfigError(f"{preset_or_path!r} is neither a preset "
                          f"({', '.join(PRESETS)}) nor a config.json file")
    if layers is not None:
        if layers < 1:
            raise ConfigError("--layers must be at least 1")
        cfg.layers = layers
        cfg.first_dense_layers = min(cfg.first_dense_layers, layers)
    if pad_vocab is not None:
        if pad_vocab < 1:
            raise ConfigError("--pad-vocab must be at least 1")
        cfg.vocab = -(-cfg.vocab // pad_vocab) * pad_vocab
    return cfg
