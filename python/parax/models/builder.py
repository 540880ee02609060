"""ModelConfig -> parax IR text.

The emitted function is

    func.func @forward(%tokens: tensor<BxSxi32>, <parameters>...) -> logits

(with `--loss`: an extra `%labels` argument and a scalar loss result). Every
parameter is a function argument named by its Hugging Face checkpoint tensor
(`parax.param`), in the checkpoint's own layout; every op carries its layer
(`parax.layer`: -1 prologue, 0..L-1 decoder layers, L epilogue).
"""

import math
import struct

from .config import ConfigError, ModelConfig, longrope_attention_factor, yarn_attention_factor

DTYPES = {"bf16": "bf16", "f32": "f32", "f16": "f16"}


def f64(x):
    """A float attribute literal MLIR parses (it needs a '.' in the mantissa)."""
    s = repr(float(x))
    if "e" in s and "." not in s.split("e")[0]:
        mantissa, exp = s.split("e")
        s = f"{mantissa}.0e{exp}"
    return f"{s} : f64"


def _in_dtype(x, dtype):
    """x rounded to the element type `dtype` (f32, or bf16 to nearest even
    from the f32), as torch holds a scalar in the model's type."""
    if dtype == "f16":
        return struct.unpack("<e", struct.pack("<e", x))[0]
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if dtype == "bf16":
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _dict_attr(d):
    items = []
    for key in sorted(d):
        value = d[key]
        if isinstance(value, bool):
            items.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            items.append(f"{key} = {value} : i64")
        elif isinstance(value, float):
            items.append(f"{key} = {f64(value)}")
        elif isinstance(value, (list, tuple)):  # numbers: array<f64: ...>
            items.append(f"{key} = array<f64: {', '.join(f64(v)[:-6] for v in value)}>")
        else:
            items.append(f'{key} = "{value}"')
    return "{" + ", ".join(items) + "}"


class _Emitter:
    """Accumulates parameters (function arguments) and op lines."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.args = []          # (ssa, type, attrs)
        self.params = {}        # checkpoint name -> ssa (tied weights share one)
        self.lines = []
        self.counter = 0
        self.layer = -1

    def ty(self, shape, dtype=None):
        dims = "x".join(str(d) for d in shape)
        elem = dtype or self.dtype
        return f"tensor<{dims}x{elem}>" if shape else f"tensor<{elem}>"

    def arg(self, name, shape, dtype="i32"):
        ssa = f"%{name}"
        self.args.append((ssa, self.ty(shape, dtype), ""))
        return ssa, list(shape)

    def param(self, name, shape):
        if name in self.params:
            return self.params[name]
        ssa = f"%p{len(self.params)}"
        attrs = f'{{parax.param = "{name}"}}'
        self.args.append((ssa, self.ty(shape), attrs))
        self.params[name] = (ssa, list(shape))
        return self.params[name]

    def op(self, name, operands, result_shapes, attrs="", prefix="",
           result_dtypes=None):
        """Emits `%r = parax.<name> [prefix] operands {attrs} : (...) -> (...)`."""
        results = []
        for _ in result_shapes:
            results.append(f"%{self.counter}")
            self.counter += 1
        dtypes = result_dtypes or [None] * len(result_shapes)
        layer_attr = f"parax.layer = {self.layer} : i64"
        attr_text = f"{{{attrs + ', ' if attrs else ''}{layer_attr}}}"
        operand_types = ", ".join(self.ty_of(o) for o in operands)
        result_types = ", ".join(self.ty(s, d) for s, d in zip(result_shapes, dtypes))
        if len(result_shapes) > 1:
            result_types = f"({result_types})"
        head = f"parax.{name} {prefix + ' ' if prefix else ''}"
        self.lines.append(
            f"    {', '.join(results)} = {head}{', '.join(o[0] for o in operands)} "
            f"{attr_text} : ({operand_types}) -> {result_types}")
        values = [(r, list(s), d) for r, s, d in zip(results, result_shapes, dtypes)]
        self._types.update({r: self.ty(s, d) for r, s, d in values})
        out = [(r, s) for r, s, _ in values]
        return out[0] if len(out) == 1 else out

    _types = None

    def ty_of(self, value):
        ssa, shape = value
        if ssa in self._types:
            return self._types[ssa]
        for a_ssa, a_ty, _ in self.args:
            if a_ssa == ssa:
                return a_ty
        raise KeyError(ssa)


class _Builder:
    def __init__(self, cfg: ModelConfig, batch, seq, dtype, past=0, return_kv=False,
                 cache=0, last_logits=False, mla="explicit"):
        self.cfg = cfg
        self.mla = mla  # DeepSeek-V3's attention: "explicit" or "absorbed"
        self.last_logits = last_logits  # the lm head on the last position only
        self.B, self.S = batch, seq
        self.past = past
        self.cache = cache
        self.position = None  # with a cache: the step's first position (an input)
        self.return_kv = return_kv
        self.new_kv = []  # this step's keys and values per layer, with return_kv
        self.e = _Emitter(DTYPES[dtype])
        self.e._types = {}

    # --- small helpers --------------------------------------------------------
    def linear(self, x, weight_name, out, inp, bias_name=None, hf_layout=True):
        """nn.Linear: weight [out, in] (transpose_w); Conv1D: [in, out]."""
        e = self.e
        w = e.param(weight_name, [out, inp] if hf_layout else [inp, out])
        operands = [x, w]
        if bias_name:
            operands.append(e.param(bias_name, [out]))
        shape = x[1][:-1] + [out]
        return e.op("linear", operands, [shape], "transpose_w" if hf_layout else "")

    def rms_norm(self, x, name, eps):
        w = self.e.param(name, [x[1][-1]])
        offset = f", offset = {f64(self.cfg.norm_offset)}" if self.cfg.norm_offset else ""
        return self.e.op("rms_norm", [x, w], [x[1]], f"eps = {f64(eps)}{offset}")

    def layer_norm(self, x, prefix, eps):
        h = x[1][-1]
        w = self.e.param(prefix + ".weight", [h])
        b = self.e.param(prefix + ".bias", [h])
        return self.e.op("layer_norm", [x, w, b], [x[1]], f"eps = {f64(eps)}")

    def reshape(self, x, shape):
        return self.e.op("reshape", [x], [shape])

    def slice(self, x, dim, start, size):
        shape = list(x[1])
        shape[dim] = size
        return self.e.op("slice", [x], [shape], f"dim = {dim} : i64, start = {start} : i64")

    def head_rows(self, hidden):
        """The positions the final norm and the lm head see: every one, or
        (last_logits) the last one alone, whose logits pick the next token."""
        return self.slice(hidden, 1, self.S - 1, 1) if self.last_logits else hidden

    def rope(self, x, rotary_dim, interleaved=False, local=False):
        """`local`: Gemma 3's sliding-window layers' rotary (their own
        theta, no scaling)."""
        cfg = self.cfg
        theta = cfg.local_rope_theta if local else cfg.rope_theta
        attrs = f"rotary_dim = {rotary_dim} : i64, theta = {f64(theta)}"
        operands = [x] + ([self.position] if self.position else [])
        if self.past:
            attrs += f", position_offset = {self.past} : i64"
        if interleaved:
            attrs += ", interleaved"
        if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") != "dynamic" and not local:
            scaling = dict(cfg.rope_scaling)
            rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None)
            scaling.pop("type", None)
            scaling["rope_type"] = rope_type
            if rope_type == "longrope":
                # LongRoPE (Phi-3): the long factors when the program's
                # positions pass the original context, else the short
                # ones (as transformers picks them by the positions of a
                # call); cos and sin scaled in the attention's scale.
                span = max(self.past + self.S, self.cache)
                old = cfg.original_max_positions
                chosen = scaling["long_factor"] if span > old else scaling["short_factor"]
                scaling = {"rope_type": "longrope", "original_max_position_embeddings": old,
                           "ext_factors": [float(v) for v in chosen]}
                scaling["factor"] = float(cfg.max_positions / old)
                # (on part of a head: the turning channels alone, not the scores)
                if rotary_dim < cfg.head_dim and longrope_attention_factor(cfg) != 1:
                    scaling["attention_factor"] = float(longrope_attention_factor(cfg))
            scaling["factor"] = float(scaling["factor"])
            if rope_type == "yarn":  # (the defaults transformers and DeepSeek take)
                scaling["original_max_position_embeddings"] = int(
                    scaling.get("original_max_position_embeddings") or cfg.max_positions)
                scaling["beta_fast"] = float(scaling.get("beta_fast") or 32)
                scaling["beta_slow"] = float(scaling.get("beta_slow") or 1)
                scaling.pop("attention_factor", None)  # (in the attention's scale)
            for key in ("low_freq_factor", "high_freq_factor", "mscale", "mscale_all_dim"):
                if key in scaling:
                    scaling[key] = float(scaling[key])
            attrs += f", scaling = {_dict_attr(scaling)}"
        return self.e.op("rope", operands, [x[1]], attrs)

    def attention(self, q, k, v, heads, kv_heads, head_dim, scale, value_dim=None):
        """With a KV cache (`past` > 0), the keys and values of the `past`
        earlier tokens are program inputs (`%past_<layer>_key`, `%past_<layer>_value`)
        (the attention's own k and v operands, after RoPE) put in front of
        this step's. `value_dim`: the values are v's first value_dim
        channels; v may then be k, and one cache (the key's) holds both."""
        shared = v is k
        if self.return_kv:
            self.new_kv += [k] if shared else [k, v]
        if self.past:
            k = self.join_cache(k, "key")
            v = k if shared else self.join_cache(v, "value")
        window = self.cfg.layer_window(self.e.layer)
        # A sliding window's generation step keeps the window's last W - 1
        # tokens in a ring, whatever the context.
        ring = bool(self.cache and window and 2 <= window < self.cache)
        if ring:
            k = self.ring_cache(k, "key", window - 1)
            v = k if shared else self.ring_cache(v, "value", window - 1)
        elif self.cache:
            k = self.write_cache(k, "key")
            v = k if shared else self.write_cache(v, "value")
        operands = [q, k, v] + ([self.position] if self.cache else [])
        shape = q[1][:3] + [value_dim or v[1][3]]
        attrs = (f"causal, head_dim = {head_dim} : i64, num_heads = {heads} : i64, "
                 f"num_kv_heads = {kv_heads} : i64, scale = {f64(scale)}")
        if value_dim:
            attrs += f", value_dim = {value_dim} : i64"
        if self.cfg.attn_softcap:  # Gemma 2
            attrs += f", softcap = {f64(self.cfg.attn_softcap)}"
        if window:  # (a decode step's too: the planner sizes its KV cache by it)
            attrs += f", window = {window} : i64"
        if ring:
            attrs += ", ring"
        return self.e.op("attention", operands, [shape], attrs)

    def ring_cache(self, x, name, rows):
        """This layer's ring cache of keys or values (an input of `rows`
        tokens, `%cache_<layer>_<name>`): the window the step attends to
        (the ring's last tokens, then `x`'s), `x` written into the ring."""
        e = self.e
        cache = e.arg(f"cache_{e.layer}_{name}", [self.B, rows] + x[1][2:], e.dtype)
        window, _ = e.op("ring_cache_update", [cache, x, self.position],
                         [[self.B, rows + x[1][1]] + x[1][2:], cache[1]])
        return window

    def write_cache(self, x, name):
        """This layer's cache of keys or values (an input of capacity
        `cache`, `%cache_<layer>_<name>`) with `x`'s rows written at the
        step's position."""
        e = self.e
        cache = e.arg(f"cache_{e.layer}_{name}", [self.B, self.cache] + x[1][2:], e.dtype)
        return e.op("cache_update", [cache, x, self.position], [cache[1]])

    def join_cache(self, x, name):
        """This layer's cached keys or values (an input) in front of `x`'s."""
        e = self.e
        cached = e.arg(f"past_{e.layer}_{name}", [self.B, self.past] + x[1][2:], e.dtype)
        return e.op("concat", [cached, x], [[self.B, self.past + x[1][1]] + x[1][2:]],
                    "dim = 1 : i64")

    def gated_mlp(self, x, prefix, width, names=("gate_proj", "up_proj", "down_proj")):
        h = self.cfg.hidden
        if self.cfg.fused:  # Phi-3: gate then up rows of one gate_up_proj [2 F, h]
            w = self.e.param(f"{prefix}.gate_up_proj.weight", [2 * width, h])
            g, u = (self.e.op("linear", [x, self.slice(w, 0, start, width)], [x[1][:-1] + [width]],
                              "transpose_w") for start in (0, width))
            s = self.e.op("swiglu", [g, u], [g[1]])
            return self.linear(s, f"{prefix}.{names[2]}.weight", h, width)
        g = self.linear(x, f"{prefix}.{names[0]}.weight", width, h)
        u = self.linear(x, f"{prefix}.{names[1]}.weight", width, h)
        if self.cfg.mlp_act in ("gelu_tanh", "gelu"):  # Gemma's GeGLU
            approx = "tanh" if self.cfg.mlp_act == "gelu_tanh" else "none"
            s = self.e.op("mul", [self.e.op("gelu", [g], [g[1]], prefix=approx), u], [g[1]])
        else:
            s = self.e.op("swiglu", [g, u], [g[1]])
        return self.linear(s, f"{prefix}.{names[2]}.weight", h, width)

    # --- attention blocks -----------------------------------------------------
    def gqa_attention(self, x, prefix):
        cfg, B, S = self.cfg, self.B, self.S
        h, nh, nkv, hd = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        if cfg.fused:  # Phi-3: q, k and v rows of one qkv_proj [(nh + 2 nkv) hd, h]
            w = self.e.param(f"{prefix}.qkv_proj.weight", [(nh + 2 * nkv) * hd, h])
            q, k, v = (self.e.op("linear", [x, self.slice(w, 0, start, rows)], [x[1][:-1] + [rows]],
                                 "transpose_w")
                       for start, rows in ((0, nh * hd), (nh * hd, nkv * hd), ((nh + nkv) * hd, nkv * hd)))
        else:
            q = self.linear(x, f"{prefix}.q_proj.weight", nh * hd, h,
                            f"{prefix}.q_proj.bias" if bias else None)
            k = self.linear(x, f"{prefix}.k_proj.weight", nkv * hd, h,
                            f"{prefix}.k_proj.bias" if bias else None)
            v = self.linear(x, f"{prefix}.v_proj.weight", nkv * hd, h,
                            f"{prefix}.v_proj.bias" if bias else None)
        q, k = self.reshape(q, [B, S, nh, hd]), self.reshape(k, [B, S, nkv, hd])
        if cfg.qk_norm:  # Qwen3, Gemma 3: each head's q and k RMS-normalised
            q = self.rms_norm(q, f"{prefix}.q_norm.weight", cfg.norm_eps)
            k = self.rms_norm(k, f"{prefix}.k_norm.weight", cfg.norm_eps)
        rot = cfg.rotary_dim or hd
        local = cfg.family == "gemma3_text" and cfg.is_local_layer(self.e.layer)  # (its own rope)
        q, k = self.rope(q, rot, local=local), self.rope(k, rot, local=local)
        v = self.reshape(v, [B, S, nkv, hd])
        scale = 1.0 / math.sqrt(cfg.query_scalar or hd)
        scaling = cfg.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) == "yarn":
            # YaRN scales cos and sin by its attention factor: q and k each,
            # the scores by its square.
            scale *= yarn_attention_factor(scaling) ** 2
        if scaling.get("rope_type") == "longrope" and rot == hd:  # (as YaRN's; on part of a head: the rope's)
            scale *= longrope_attention_factor(cfg) ** 2
        o = self.attention(q, k, v, nh, nkv, hd, scale)
        o = self.reshape(o, [B, S, nh * hd])
        return self.linear(o, f"{prefix}.o_proj.weight", h, nh * hd)

    def mla_attention(self, x, prefix):
        """DeepSeek-V3 multi-head latent attention, in its explicit form (the
        latent KV is expanded per head by kv_b_proj; no weight absorption)."""
        cfg, B, S, e = self.cfg, self.B, self.S, self.e
        h, nh = cfg.hidden, cfg.heads
        nope, rope_d, vd = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        qk = nope + rope_d
        if cfg.q_lora_rank:
            q = self.linear(x, f"{prefix}.q_a_proj.weight", cfg.q_lora_rank, h)
            q = self.rms_norm(q, f"{prefix}.q_a_layernorm.weight", cfg.norm_eps)
            q = self.linear(q, f"{prefix}.q_b_proj.weight", nh * qk, cfg.q_lora_rank)
        else:
            q = self.linear(x, f"{prefix}.q_proj.weight", nh * qk, h)
        q = self.reshape(q, [B, S, nh, qk])
        q_nope = self.slice(q, 3, 0, nope)
        q_pe = self.rope(self.slice(q, 3, nope, rope_d), rope_d, interleaved=True)
        ckv = self.linear(x, f"{prefix}.kv_a_proj_with_mqa.weight",
                          cfg.kv_lora_rank + rope_d, h)
        c = self.slice(ckv, 2, 0, cfg.kv_lora_rank)
        k_pe = self.reshape(self.slice(ckv, 2, cfg.kv_lora_rank, rope_d), [B, S, 1, rope_d])
        k_pe = self.rope(k_pe, rope_d, interleaved=True)
        c = self.rms_norm(c, f"{prefix}.kv_a_layernorm.weight", cfg.norm_eps)
        scale = 1.0 / math.sqrt(qk)
        scaling = cfg.rope_scaling or {}
        if scaling.get("mscale_all_dim") and float(scaling.get("factor", 1)) > 1:
            m = 0.1 * float(scaling["mscale_all_dim"]) * math.log(float(scaling["factor"])) + 1.0
            scale *= m * m
        if self.mla == "absorbed":
            return self.absorbed_mla(prefix, q_nope, q_pe, c, k_pe, scale)
        if self.mla == "expanded":
            return self.expanded_mla(prefix, q_nope, q_pe, c, k_pe, scale)
        kv = self.linear(c, f"{prefix}.kv_b_proj.weight", nh * (nope + vd),
                         cfg.kv_lora_rank)
        kv = self.reshape(kv, [B, S, nh, nope + vd])
        k_nope = self.slice(kv, 3, 0, nope)
        v = self.slice(kv, 3, nope, vd)
        k_pe = e.op("broadcast", [k_pe], [[B, S, nh, rope_d]])
        qf = e.op("concat", [q_nope, q_pe], [[B, S, nh, qk]], "dim = 3 : i64")
        kf = e.op("concat", [k_nope, k_pe], [[B, S, nh, qk]], "dim = 3 : i64")
        o = self.attention(qf, kf, v, nh, nh, qk, scale)
        o = self.reshape(o, [B, S, nh * vd])
        return self.linear(o, f"{prefix}.o_proj.weight", h, nh * vd)

    def absorbed_mla(self, prefix, q_nope, q_pe, c, k_pe, scale):
        """The weight-absorbed form of the same attention: kv_b_proj's key
        half folded into the queries and its value half applied after the
        attention (`parax.head_linear`, per head), so that the attention
        reads one latent KV head, [latent, rope key] as the key and its
        first kv_lora_rank channels, the latent, as the value: one KV cache
        of kv_lora_rank + qk_rope_dim values a token a layer instead of
        heads x (qk + v)."""
        cfg, B, S, e = self.cfg, self.B, self.S, self.e
        h, nh, lora = cfg.hidden, cfg.heads, cfg.kv_lora_rank
        nope, rope_d, vd = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        # The checkpoint's [nh * (nope + vd), lora], read by heads.
        w = e.param(f"{prefix}.kv_b_proj.weight", [nh, nope + vd, lora])
        w_uk, w_uv = self.slice(w, 1, 0, nope), self.slice(w, 1, nope, vd)
        q_latent = e.op("head_linear", [q_nope, w_uk], [[B, S, nh, lora]])
        qf = e.op("concat", [q_latent, q_pe], [[B, S, nh, lora + rope_d]], "dim = 3 : i64")
        latent = self.reshape(c, [B, S, 1, lora])
        kf = e.op("concat", [latent, k_pe], [[B, S, 1, lora + rope_d]], "dim = 3 : i64")
        o = self.attention(qf, kf, kf, nh, 1, lora + rope_d, scale, value_dim=lora)
        o = e.op("head_linear", [o, w_uv], [[B, S, nh, vd]], "transpose_w")
        o = self.reshape(o, [B, S, nh * vd])
        return self.linear(o, f"{prefix}.o_proj.weight", h, nh * vd)

    def expanded_mla(self, prefix, q_nope, q_pe, c, k_pe, scale):
        """The absorbed form's latent cache read by the explicit form's
        attention: every cached row's latent expanded per head by kv_b_proj
        (each run), then attention over 192-wide keys and 128-wide values.
        A prefill's form: it writes the caches the absorbed step reads, with
        the explicit form's (query, key) work (2·192 + 2·128 a pair, not
        2·576 + 2·512); the expansion costs a linear over the cache's rows."""
        cfg, B, S, e = self.cfg, self.B, self.S, self.e
        h, nh, lora = cfg.hidden, cfg.heads, cfg.kv_lora_rank
        nope, rope_d, vd = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        rows = e.op("concat", [self.reshape(c, [B, S, 1, lora]), k_pe], [[B, S, 1, lora + rope_d]],
                    "dim = 3 : i64")
        if self.return_kv:
            self.new_kv.append(rows)
        if self.past:
            rows = self.join_cache(rows, "key")
        if self.cache:
            rows = self.write_cache(rows, "key")
        T = rows[1][1]
        latent = self.reshape(self.slice(rows, 3, 0, lora), [B, T, lora])
        kv = self.reshape(self.linear(latent, f"{prefix}.kv_b_proj.weight", nh * (nope + vd), lora),
                          [B, T, nh, nope + vd])
        k_pe = e.op("broadcast", [self.slice(rows, 3, lora, rope_d)], [[B, T, nh, rope_d]])
        kf = e.op("concat", [self.slice(kv, 3, 0, nope), k_pe], [[B, T, nh, nope + rope_d]], "dim = 3 : i64")
        qf = e.op("concat", [q_nope, q_pe], [[B, S, nh, nope + rope_d]], "dim = 3 : i64")
        operands = [qf, kf, self.slice(kv, 3, nope, vd)] + ([self.position] if self.cache else [])
        o = e.op("attention", operands, [[B, S, nh, vd]],
                 f"causal, head_dim = {nope + rope_d} : i64, num_heads = {nh} : i64, "
                 f"num_kv_heads = {nh} : i64, scale = {f64(scale)}")
        o = self.reshape(o, [B, S, nh * vd])
        return self.linear(o, f"{prefix}.o_proj.weight", h, nh * vd)

    # --- MLP blocks -----------------------------------------------------------
    def moe(self, x, prefix):
        cfg, e = self.cfg, self.e
        h, E, k, F = cfg.hidden, cfg.num_experts, cfg.top_k, cfg.moe_ffn
        if cfg.family == "mixtral":
            gate_name, experts = f"{prefix}.gate.weight", f"{prefix}.experts.{{e}}"
            names = ("w1", "w3", "w2")
        else:
            gate_name, experts = f"{prefix}.gate.weight", f"{prefix}.experts.{{e}}"
            names = ("gate_proj", "up_proj", "down_proj")
        operands = [x, e.param(gate_name, [E, h])]
        if cfg.router_bias:
            operands.append(e.param(f"{prefix}.gate.e_score_correction_bias", [E]))
        attrs = [f"num_experts = {E} : i64", f"top_k = {k} : i64"]
        if cfg.normalize_topk:
            attrs.append("normalize")
        if cfg.routed_scaling != 1.0:
            attrs.append(f"scaling_factor = {f64(cfg.routed_scaling)}")
        if cfg.num_groups > 1:
            attrs += [f"num_groups = {cfg.num_groups} : i64",
                      f"topk_groups = {cfg.topk_groups} : i64"]
        if cfg.router_aux_loss_coef:
            attrs.append(f"aux_loss_coef = {f64(cfg.router_aux_loss_coef)}")
            if cfg.sequence_aux:
                attrs.append("sequence_aux")
        routed_shape = x[1][:-1] + [k]
        weights, indices = e.op("router", operands, [routed_shape, routed_shape],
                                ", ".join(attrs), prefix=cfg.score_func,
                                result_dtypes=[None, "i32"])
        wg = e.param(f"{experts}.{names[0]}.weight", [E, F, h])
        wu = e.param(f"{experts}.{names[1]}.weight", [E, F, h])
        wd = e.param(f"{experts}.{names[2]}.weight", [E, h, F])
        y = e.op("experts", [x, weights, indices, wg, wu, wd], [x[1]])
        if cfg.shared_ffn:
            if cfg.family == "qwen2_moe":
                shared = self.gated_mlp(x, f"{prefix}.shared_expert", cfg.shared_ffn)
                gate = self.linear(x, f"{prefix}.shared_expert_gate.weight", 1, h)
                gate = e.op("sigmoid", [gate], [gate[1]])
                shared = e.op("mul", [gate, shared], [shared[1]])
            else:
                shared = self.gated_mlp(x, f"{prefix}.shared_experts", cfg.shared_ffn)
            y = e.op("add", [y, shared], [y[1]])
        return y

    # --- families -------------------------------------------------------------
    def build_decoder(self, tokens):
        """Llama, Mixtral, Qwen2-MoE, DeepSeek-V3: pre-norm RMSNorm decoders."""
        cfg, e = self.cfg, self.e
        e.layer = -1
        table = e.param("model.embed_tokens.weight", [cfg.vocab, cfg.hidden])
        # (Gemma: scaled by sqrt(hidden) in the model's type, as transformers)
        scale = f"scale = {f64(_in_dtype(math.sqrt(cfg.hidden), e.dtype))}" if cfg.embed_scale else ""
        hidden = e.op("embedding", [tokens, table], [tokens[1] + [cfg.hidden]], scale)
        for i in range(cfg.layers):
            e.layer = i
            hidden = self.decoder_layer(hidden, i)
        e.layer = cfg.layers
        self.trunk = hidden  # (what multi-token prediction's first depth reads)
        x = self.rms_norm(self.head_rows(hidden), "model.norm.weight", cfg.norm_eps)
        logits = self.linear(x, self.head_weight(), cfg.vocab, cfg.hidden)
        if cfg.final_softcap:  # Gemma 2
            logits = e.op("softcap", [logits], [logits[1]], f"cap = {f64(cfg.final_softcap)}")
        return logits

    def head_weight(self):
        return "model.embed_tokens.weight" if self.cfg.tie_embeddings else "lm_head.weight"

    def decoder_layer(self, hidden, i):
        """Checkpoint layer i (model.layers.i): attention, then the MLP or
        the experts, each a pre-norm residual branch."""
        cfg, e = self.cfg, self.e
        p = f"model.layers.{i}"
        x = self.rms_norm(hidden, f"{p}.input_layernorm.weight", cfg.norm_eps)
        if cfg.family == "deepseek_v3":
            a = self.mla_attention(x, f"{p}.self_attn")
        else:
            a = self.gqa_attention(x, f"{p}.self_attn")
        if cfg.sandwich_norms:  # Gemma 3: each branch's output normalised too
            a = self.rms_norm(a, f"{p}.post_attention_layernorm.weight", cfg.norm_eps)
        hidden = e.op("add", [hidden, a], [hidden[1]])
        x = self.rms_norm(hidden, f"{p}.{'pre_feedforward' if cfg.sandwich_norms else 'post_attention'}"
                                  f"_layernorm.weight", cfg.norm_eps)
        if cfg.is_moe_layer(i):
            block = "block_sparse_moe" if cfg.family == "mixtral" else "mlp"
            m = self.moe(x, f"{p}.{block}")
        else:
            m = self.gated_mlp(x, f"{p}.mlp", cfg.ffn)
        if cfg.sandwich_norms:
            m = self.rms_norm(m, f"{p}.post_feedforward_layernorm.weight", cfg.norm_eps)
        return e.op("add", [hidden, m], [hidden[1]])

    def multi_token_prediction(self, tokens, labels, loss, depths, weight, ignore_index):
        """DeepSeek-V3's multi-token prediction (report §2.2): depth k reads
        the previous depth's hidden states (the trunk's, before its final
        norm, at k = 1) and the embedding of the tokens k ahead, joined as
        eh_proj · [enorm(embedding); hnorm(hidden)] (the checkpoint's order:
        vLLM's and SGLang's), through one more decoder layer
        (model.layers.{L + k - 1}), its own final norm and the shared
        head; its loss is the cross-entropy against the labels k ahead (the
        last k positions not counted), weighted weight / depths, added to
        `loss`. All of it is in the head's layer (the last pipeline stage)."""
        cfg, e, h = self.cfg, self.e, self.cfg.hidden
        table = e.param("model.embed_tokens.weight", [cfg.vocab, h])
        hidden = self.trunk
        for k in range(1, depths + 1):
            p = f"model.layers.{cfg.layers + k - 1}"
            ahead = e.op("shift", [tokens], [tokens[1]], f"shift = {k} : i64, fill = 0 : i64",
                         result_dtypes=["i32"])
            embedded = e.op("embedding", [ahead, table], [tokens[1] + [h]])
            joined = e.op("concat", [self.rms_norm(embedded, f"{p}.enorm.weight", cfg.norm_eps),
                                     self.rms_norm(hidden, f"{p}.hnorm.weight", cfg.norm_eps)],
                          [hidden[1][:-1] + [2 * h]], "dim = 2 : i64")
            hidden = self.decoder_layer(self.linear(joined, f"{p}.eh_proj.weight", h, 2 * h),
                                        cfg.layers + k - 1)
            x = self.rms_norm(hidden, f"{p}.shared_head.norm.weight", cfg.norm_eps)
            logits = self.linear(x, self.head_weight(), cfg.vocab, h)
            target = e.op("shift", [labels], [labels[1]],
                          f"shift = {k} : i64, fill = {int(ignore_index)} : i64", result_dtypes=["i32"])
            term = self.cross_entropy(logits, target, ignore_index, weight / depths)
            loss = e.op("add", [loss, term], [[]], result_dtypes=["f32"])
        return loss

    def cross_entropy(self, logits, labels, ignore_index=None, weight=None):
        """The mean token cross-entropy; with `ignore_index`, over the labels
        parax.label_count counts; with `weight`, times it."""
        e = self.e
        attrs = [f"ignore_index = {int(ignore_index)} : i64"] if ignore_index is not None else []
        operands = [logits, labels]
        if attrs:
            operands.append(e.op("label_count", [labels], [[]], attrs[0], result_dtypes=["f32"]))
        if weight is not None:
            attrs.append(f"weight = {f64(weight)}")
        return e.op("cross_entropy", operands, [[]], ", ".join(attrs), result_dtypes=["f32"])

    def build_gpt2(self, tokens):
        cfg, e, B, S = self.cfg, self.e, self.B, self.S
        h, nh, hd = cfg.hidden, cfg.heads, cfg.head_dim
        if self.past + S > cfg.max_positions or self.cache > cfg.max_positions:
            what = (f"cache capacity {self.cache}" if self.cache > cfg.max_positions else
                    f"{'past ' + str(self.past) + ' + ' if self.past else ''}sequence {S}")
            raise ValueError(f"{what} exceeds n_positions {cfg.max_positions}")
        e.layer = -1
        wte = e.param("transformer.wte.weight", [cfg.vocab, h])
        wpe = e.param("transformer.wpe.weight", [cfg.max_positions, h])
        tok = e.op("embedding", [tokens, wte], [tokens[1] + [h]])
        if self.position:
            pos = e.op("position_embedding", [wpe, self.position], [[1, S, h]])
        else:
            pos = e.op("position_embedding", [wpe], [[1, S, h]], f"offset = {self.past} : i64")
        hidden = e.op("add", [tok, pos], [tok[1]])
        for i in range(cfg.layers):
            e.layer = i
            p = f"transformer.h.{i}"
            x = self.layer_norm(hidden, f"{p}.ln_1", cfg.norm_eps)
            # c_attn is one Conv1D [H, 3H]: slice its weight and bias into q, k, v.
            w = e.param(f"{p}.attn.c_attn.weight", [h, 3 * h])
            b = e.param(f"{p}.attn.c_attn.bias", [3 * h])
            qkv = []
            for j in range(3):
                wj = self.slice(w, 1, j * h, h)
                bj = self.slice(b, 0, j * h, h)
                y = e.op("linear", [x, wj, bj], [[B, S, h]])
                qkv.append(self.reshape(y, [B, S, nh, hd]))
            o = self.attention(*qkv, nh, nh, hd, 1.0 / math.sqrt(hd))
            o = self.reshape(o, [B, S, h])
            a = self.linear(o, f"{p}.attn.c_proj.weight", h, h,
                            f"{p}.attn.c_proj.bias", hf_layout=False)
            hidden = e.op("add", [hidden, a], [hidden[1]])
            x = self.layer_norm(hidden, f"{p}.ln_2", cfg.norm_eps)
            f = self.linear(x, f"{p}.mlp.c_fc.weight", cfg.ffn, h,
                            f"{p}.mlp.c_fc.bias", hf_layout=False)
            f = e.op("gelu", [f], [f[1]], prefix=cfg.gelu_approx)
            m = self.linear(f, f"{p}.mlp.c_proj.weight", h, cfg.ffn,
                            f"{p}.mlp.c_proj.bias", hf_layout=False)
            hidden = e.op("add", [hidden, m], [hidden[1]])
        e.layer = cfg.layers
        x = self.layer_norm(self.head_rows(hidden), "transformer.ln_f", cfg.norm_eps)
        # The lm head is tied to wte ([V, H], i.e. [out, in]).
        return self.linear(x, "transformer.wte.weight", cfg.vocab, h)

    def build(self, loss=False, ignore_index=None, mtp_depths=0, mtp_weight=0.0):
        e = self.e
        tokens = e.arg("tokens", [self.B, self.S])
        labels = e.arg("labels", [self.B, self.S]) if loss else None
        if self.cache:
            self.position = e.arg("position", [])
        if self.cfg.family == "gpt2":
            logits = self.build_gpt2(tokens)
        else:
            logits = self.build_decoder(tokens)
        result = logits
        if loss and mtp_depths and ignore_index is None:
            # Multi-token prediction's labels past the sequence are not
            # counted (-100): the main loss counts its labels too (all of
            # them), so the labels load whole as its count and the depths'
            # shifts read them.
            ignore_index = -100
        if loss:
            result = self.cross_entropy(logits, labels, ignore_index)
        if mtp_depths:
            result = self.multi_token_prediction(tokens, labels, result, mtp_depths, mtp_weight, ignore_index)
        results = [result] + self.new_kv
        types = ", ".join(e.ty_of(r) for r in results)
        result_type = f"({types})" if len(results) > 1 else types
        args = ",\n      ".join(f"{ssa}: {ty}{' ' + attrs if attrs else ''}"
                               for ssa, ty, attrs in e.args)
        header = (f"// parax model: {self.cfg.name} ({self.cfg.family}), "
                  f"{self.cfg.layers} layers, batch {self.B}, sequence {self.S}"
                  f"{f', after {self.past} cached tokens' if self.past else ''}"
                  f"{f', over a KV cache of {self.cache} tokens' if self.cache else ''}"
                  f"{', logits of the last position' if self.last_logits else ''}"
                  f"{f', {mtp_depths} multi-token prediction depth(s) weighted {mtp_weight:g}' if mtp_depths else ''}\n")
        return (header + "module {\n"
                f"  func.func @forward(\n      {args}) -> {result_type} {{\n"
                + "\n".join(e.lines) + "\n"
                f"    return {', '.join(r[0] for r in results)} : {types}\n  }}\n}}\n")


def build_model(cfg: ModelConfig, batch=1, seq=None, dtype="bf16", loss=False, past=0,
                return_kv=False, cache=0, last_logits=False, mla="explicit", ignore_index=None,
                mtp_weight=None, mtp_depths=None):
    """Returns the parax IR text of `cfg`'s forward pass (and loss with `loss`).

    `past` > 0 builds a step over a KV cache: `seq` new tokens (1 for a decode
    step) at positions past .. past + seq - 1, attending to the cache's `past`
    keys and values, which are inputs after the tokens, two per layer (key,
    value; each `[batch, past, kv_heads, head_dim]` as the attention reads
    them, keys after RoPE).

    `return_kv` also returns, after the logits, each layer's keys and values
    of this step's tokens (`[batch, seq, kv_heads, head_dim]`, key then
    value per layer): what a cache of the next step appends.

    `cache` > 0 builds one step of a generation loop instead: `seq` tokens at
    a run-time position (an input `%position : tensor<i32>` after the
    tokens) over per-layer caches of capacity `cache` (`%cache_<layer>_key`,
    `%cache_<layer>_value`, `[batch, cache, kv_heads, head_dim]`), into which
    the step writes its keys and values (`parax.cache_update`) before its
    attention reads them. The same program runs every step; `parax-run
    --generate` keeps the caches on the device between steps.

    `last_logits` computes the logits of the last position alone
    (`[batch, 1, vocab]`): all a prefill needs to pick the next token, without
    the lm head's work and memory for every other position (a chunk of 2048
    tokens of a 128K vocabulary: 2048x fewer).

    `mla="absorbed"` builds DeepSeek-V3's attention in its weight-absorbed
    form (the same function of the same checkpoint): its KV cache holds the
    latent, one KV head of [kv_lora_rank + qk_rope_dim] keys whose first
    kv_lora_rank channels are the values (one cache a layer, `%cache_<layer>_key`
    or `%past_<layer>_key`; with return_kv, one result a layer), instead of
    every head's expanded keys and values (DeepSeek-V3: 576 values a token
    a layer instead of 40,960). Inference only (no gradient rule for
    `parax.head_linear` yet). `mla="expanded"` writes and reads the same
    latent cache with the explicit form's attention, every cached latent
    expanded per head: a prefill for the absorbed step, with 3.4x less
    attention work a (query, key) pair.

    `ignore_index` (with `loss`; Hugging Face's -100): a label of that
    value is not counted, the loss the mean over the others
    (`parax.label_count` then `parax.cross_entropy` with `ignore_index`):
    a prompt's or a padding's tokens left out of a fine-tuning loss.

    `mtp_weight` λ > 0 (with `loss`; DeepSeek-V3 trained with 0.3, then
    0.1): multi-token prediction, `mtp_depths` D modules (default: the
    config's num_nextn_predict_layers), each predicting one token further
    ahead; the loss is the cross-entropy plus λ / D times the sum of the
    depths' (Megatron-LM's mtp_loss_scaling_factor). Its weights are the
    checkpoint's model.layers.{L}.. (enorm, hnorm, eh_proj, shared_head.norm
    and a decoder layer), the embedding and the head shared. A filled
    position (past the sequence) is not counted: its label is the loss's
    ignore_index (-100 without one)."""
    if mtp_depths is not None and not mtp_weight:
        raise ValueError("mtp_depths: give the multi-token prediction loss's weight (mtp_weight) too")
    if mtp_weight is not None:
        if not loss:
            raise ValueError("multi-token prediction (mtp_weight) is a training loss: give it with loss")
        if not mtp_weight > 0 or not math.isfinite(mtp_weight):
            raise ValueError(f"mtp_weight must be a positive number, got {mtp_weight}")
        if cfg.family == "gpt2":
            raise ValueError(f"multi-token prediction: {cfg.name} (gpt2) is not a pre-norm RMSNorm decoder")
        mtp_depths = cfg.mtp_layers if mtp_depths is None else mtp_depths
        if mtp_depths < 1:
            raise ValueError(f"multi-token prediction: {cfg.name} has no num_nextn_predict_layers; "
                             "give the depths (mtp_depths)")
    if ignore_index is not None and not loss:
        raise ValueError("ignore_index is the loss's: give it with loss")
    if mla not in ("explicit", "absorbed", "expanded"):
        raise ValueError(f"mla {mla!r} is not one of explicit, absorbed, expanded")
    if mla != "explicit" and cfg.family != "deepseek_v3":
        raise ValueError(f"mla={mla}: {cfg.name} ({cfg.family}) has no multi-head latent attention")
    if mla != "explicit" and loss:
        raise ValueError(f"mla={mla} is an inference form: no loss (train the explicit form)")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if seq is None:
        seq = min(2048, cfg.max_positions, cfg.sliding_window or cfg.max_positions)
    if batch < 1 or seq < 1:
        raise ValueError("batch and sequence must be positive")
    if past < 0:
        raise ValueError("past (cached tokens) must not be negative")
    if (past or return_kv or cache) and loss:
        raise ValueError("a step over a KV cache (past, return_kv, cache) is inference: no loss")
    if cache < 0:
        raise ValueError("cache (capacity in tokens) must not be negative")
    if cache and (past or return_kv):
        raise ValueError("cache (a generation step's capacity) replaces past and return_kv: "
                         "give one or the other")
    if cache and seq > cache:
        raise ValueError(f"sequence {seq} does not fit a cache of {cache} tokens")
    if last_logits and loss:
        raise ValueError("last_logits: the loss needs every position's logits")
    span = max(past + seq, cache)  # the positions the program's attention may see
    if (cfg.rope_scaling or {}).get("rope_type") == "dynamic" and span > cfg.max_positions:
        raise ConfigError(f"{cfg.name} ({cfg.family}): dynamic NTK rope scaling past "
                          f"max_position_embeddings {cfg.max_positions} (a program of {span} "
                          f"positions) is not implemented")
    if (cfg.rope_scaling or {}).get("rope_type") == "longrope" and cache > cfg.original_max_positions:
        raise ConfigError(f"{cfg.name} ({cfg.family}): LongRoPE switches from its short to its long "
                          f"factors past original_max_position_embeddings "
                          f"{cfg.original_max_positions}, and transformers then recomputes the "
                          f"cache; a generation step over a cache of {cache} positions is not "
                          f"implemented (build one of at most {cfg.original_max_positions}, or "
                          f"prefill programs)")
    if cfg.sliding_window and span > cfg.sliding_window and not cfg.window_masked:
        raise ConfigError(f"{cfg.name} ({cfg.family}) attends over a sliding window of "
                          f"{cfg.sliding_window} tokens, which parax does not implement: a program "
                          f"of {span} positions would see tokens beyond it (build one of at most "
                          f"{cfg.sliding_window})")
    if mtp_depths and mtp_depths >= seq:
        raise ValueError(f"multi-token prediction: {mtp_depths} depth(s) need a sequence longer "
                         f"than {mtp_depths}, got {seq}")
    return _Builder(cfg, batch, seq, dtype, past, return_kv, cache, last_logits, mla).build(
        loss=loss, ignore_index=ignore_index, mtp_depths=mtp_depths or 0, mtp_weight=mtp_weight or 0.0)


def parameter_shapes(cfg: ModelConfig, mtp_depths=0):
    """Checkpoint tensor name -> shape, as the built graph declares them
    (a name with `{e}` is a stack of per-expert tensors along dim 0); with
    `mtp_depths`, multi-token prediction's modules' too (after the others)."""
    b = _Builder(cfg, 1, mtp_depths + 1, "bf16")
    b.build(loss=mtp_depths > 0, mtp_depths=mtp_depths, mtp_weight=1.0)
    return {name: shape for name, (_, shape) in b.e.params.items()}
