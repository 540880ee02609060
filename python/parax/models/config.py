"""Model configs: the fields of a Hugging Face `config.json`, normalised."""

import copy
import dataclasses
import json
import os
from typing import Optional

from .presets import PRESETS

FAMILIES = ("llama", "gpt2", "mixtral", "qwen2_moe", "deepseek_v3")


class ConfigError(ValueError):
    """A config that names no known family or lacks a required field."""


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
    attention_bias: bool = False
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
    name: str = "model"

    @property
    def is_moe(self):
        return self.num_experts > 0

    def is_moe_layer(self, layer):
        return self.is_moe and layer >= self.first_dense_layers


def _need(raw, *keys):
    for key in keys:
        if key in raw:
            return raw[key]
    raise ConfigError(f"config lacks '{keys[0]}'")


def from_hf_dict(raw, name="model"):
    """Builds a ModelConfig from a Hugging Face config dictionary."""
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(
            f"model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})")
    if family == "gpt2":
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

    hidden = _need(raw, "hidden_size")
    heads = _need(raw, "num_attention_heads")
    cfg = ModelConfig(
        family=family, name=name, hidden=hidden,
        layers=_need(raw, "num_hidden_layers"), heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        ffn=_need(raw, "intermediate_size"), vocab=_need(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 4096),
        norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rope_scaling=copy.deepcopy(raw.get("rope_scaling")),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", family == "qwen2_moe")))
    if family in ("mixtral", "qwen2_moe") and raw.get("output_router_logits"):
        cfg.router_aux_loss_coef = float(raw.get("router_aux_loss_coef", 0.001))
    if family == "mixtral":
        cfg.num_experts = _need(raw, "num_local_experts")
        cfg.top_k = _need(raw, "num_experts_per_tok")
        cfg.moe_ffn = cfg.ffn
        cfg.normalize_topk = True
    elif family == "qwen2_moe":
        cfg.num_experts = _need(raw, "num_experts")
        cfg.top_k = _need(raw, "num_experts_per_tok")
        cfg.moe_ffn = _need(raw, "moe_intermediate_size")
        cfg.shared_ffn = raw.get("shared_expert_intermediate_size", 0)
        cfg.shared_expert_gate = cfg.shared_ffn > 0
        cfg.normalize_topk = bool(raw.get("norm_topk_prob", False))
        if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
            raise ConfigError("qwen2_moe: mlp_only_layers / decoder_sparse_step "
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
    if cfg.heads % cfg.kv_heads:
        raise ConfigError(f"num_key_value_heads {cfg.kv_heads} does not divide "
                          f"num_attention_heads {cfg.heads}")
    return cfg


def load_config(preset_or_path, layers=None, pad_vocab=None):
    """A preset name or a path to a Hugging Face config.json -> ModelConfig.
    `pad_vocab=M`: the vocabulary rounded up to a multiple of M, as
    Megatron-LM pads it (--make-vocab-size-divisible-by, times its tensor
    parallel degree) so that tensor parallelism divides the embedding and
    the output head: a model of that many classes, the added ones never a
    label (trained towards zero probability), whose checkpoint has as many
    rows (a Hugging Face GPT-2's 50,257 do not: parax-run refuses it)."""
    if preset_or_path in PRESETS:
        cfg = from_hf_dict(copy.deepcopy(PRESETS[preset_or_path]), preset_or_path)
    elif os.path.exists(preset_or_path):
        with open(preset_or_path) as f:
            try:
                raw = json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{preset_or_path}: not valid JSON: {e}") from e
        name = os.path.basename(os.path.dirname(os.path.abspath(preset_or_path)))
        cfg = from_hf_dict(raw, name or "model")
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
