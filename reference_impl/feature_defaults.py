"""Which KV-cache features a model runs with: the rule that turns prefix caching and chunked
prefill off for non-causal, pooling, encoder-decoder, attention-free and hybrid models.

``kv_feature_defaults(model, profile)`` takes the model facts vLLM reads (``KVModelFacts``) and
the user's explicit ``enable_prefix_caching`` / ``enable_chunked_prefill`` (None: not given)
and answers the effective settings (``KVFeatureDefaults``) on a CUDA GPU, V1 engine, before any
platform hook (the CPU/TPU/XPU/RISC-V platforms turn chunked prefill off on their own; not
modelled), and the codes of the rules that turned a feature off (``FEATURE_OFF_REASONS``).

vLLM 0.33.0, in the order the engine applies them:

1. defaults (``engine/arg_utils.py:3041-3095``,
   ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``): a feature the user
   left None takes ``ModelConfig.is_chunked_prefill_supported`` /
   ``is_prefix_caching_supported`` (``config/model.py:2193-2291``); an explicit True or False
   wins (pooling models only get a warning). Both read ``ModelConfig.attn_type``
   (``config/model.py:2173-2190``): a pooling model is ``encoder_only`` when its class's
   ``default_seq_pooling_type`` is ``CLS`` or ``hf_config.is_causal`` is False, else its
   class's ``attn_type`` (``interfaces_base.py:183``, ``decoder`` unless decorated); a
   generate model is ``hybrid``, ``attention_free``, ``encoder_decoder`` or ``decoder``, in
   that order. Supported: pooling ``encoder_only``: neither (reason ``encoder_only``); pooling
   ``decoder``: both unless ``seq_pooling_type`` is ``MEAN``/``CLS`` or ``tok_pooling_type`` is
   ``STEP`` (``pooling_type``); pooling ``attention_free``: chunked prefill only
   (``attention_free``); generate ``encoder_decoder``: neither (``encoder_decoder``); generate
   ``attention_free``: chunked prefill only (``attention_free``); generate ``hybrid`` and
   ``decoder``: both.
2. ``SchedulerConfig.__post_init__`` (``config/scheduler.py:295-304``): an encoder-decoder
   model's chunked prefill is forced off (``encoder_decoder``), even when the user asked.
3. ``VllmConfig.try_verify_and_update_config`` (``config/vllm.py:2766-2767``;
   ``models/config.py:750-787``, ``MambaModelConfig``, reached through
   ``HybridAttentionMambaModelConfig`` for hybrid models and ``MODELS_CONFIG_MAP`` for the
   attention-free Mamba architectures): prefix caching on with chunked prefill off is vLLM's
   AssertionError "Chunked prefill is required for Mamba prefix caching." (a
   ``KVCacheConfigError`` here).
4. ``EngineCore._initialize_kv_caches`` (``v1/engine/core.py:259-280``): a layer whose KV-cache
   spec is ``non_causal`` (``v1/kv_cache_interface.py:634``, set by
   ``PrefillPrefixLMAttention``) forces both off (``non_causal_layers``), even when asked.

vLLM 0.10.2:

1. ``EngineArgs._set_default_args_v1`` (``engine/arg_utils.py:1615-1642``): a generate model
   gets chunked prefill on whatever the user said (V1 always chunks), prefix caching on unless
   the user said False; a pooling model's features left None are on only when its
   ``pooling_type`` (the user's, else the class's ``default_pooling_type``, ``LAST`` unless
   decorated; compared case-insensitively) is ``LAST`` and ``hf_config.is_causal``.
2. ``VllmConfig.try_verify_and_update_config`` (``config/__init__.py:3681-3701``;
   ``models/config.py:289-324``, ``MambaModelConfig``): the attention-free Mamba
   architectures (``attention_free``) and every hybrid model (``hybrid``) get prefix caching
   forced off.
3. ``VllmConfig.__post_init__`` (``config/__init__.py:3443-3484``,
   ``disable_chunked_prefill_reasons``): a pooling model whose ``pooling_type`` is not
   ``LAST`` (``pooling_type``) or that is not causal (``non_causal``), else an encoder-decoder
   model (``encoder_decoder``), gets both forced off, even when the user asked.

A user's explicit False is the reason ``user`` when vLLM keeps it (not 0.10.2's chunked prefill
of a generate model). ``reasons`` lists each applicable code once, sorted: a default that came
out off, a forcing rule whose condition holds (even if the feature was already off), a kept
False of the user. A field the profile's vLLM does not have, an unknown runner, pooling type or
attention type, or a non-bool flag is a ``KVCheckInputError`` naming the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.errors import KVCacheConfigError

__all__ = ["FEATURE_OFF_REASONS", "MODEL_ATTN_TYPES", "POOLING_TYPES_0_10", "RUNNERS",
           "SEQ_POOLING_TYPES", "TOK_POOLING_TYPES", "KVFeatureDefaults", "KVModelFacts",
           "kv_feature_defaults"]

#: ``ModelConfig.runner_type`` values the rule reads.
RUNNERS: tuple[str, ...] = ("generate", "pooling")
#: 0.33 ``config/pooler.py:16,19``: ``SequencePoolingType`` and ``TokenPoolingType``.
SEQ_POOLING_TYPES: tuple[str, ...] = ("CLS", "LAST", "MEAN")
TOK_POOLING_TYPES: tuple[str, ...] = ("ALL", "STEP")
#: 0.10.2 ``model_executor/layers/pooler.py:31-37``: ``PoolingType``'s names.
POOLING_TYPES_0_10: tuple[str, ...] = ("LAST", "ALL", "CLS", "STEP", "MEAN")
#: 0.33: the ``attn_type`` a pooling model class declares (``interfaces_base.attn_type``; the
#: values vLLM 0.33's pooling models use).
MODEL_ATTN_TYPES: tuple[str, ...] = ("decoder", "encoder_only", "attention_free")
#: The codes of ``KVFeatureDefaults.reasons`` (see the module docstring for each rule).
FEATURE_OFF_REASONS: tuple[str, ...] = ("attention_free", "encoder_decoder", "encoder_only",
                                        "hybrid", "non_causal", "non_causal_layers",
                                        "pooling_type", "user")
_PROFILES = ("vllm-0.33", "vllm-0.10", "generic")
_ONLY_033 = ("seq_pooling_type", "tok_pooling_type", "default_seq_pooling_type",
             "default_tok_pooling_type", "model_attn_type")
_ONLY_010 = ("pooling_type", "default_pooling_type")


@dataclass(frozen=True)
class KVModelFacts:
    """What vLLM reads of a model and of the user's arguments to decide prefix caching and
    chunked prefill. Release-specific fields are None unless given; giving one under the other
    release is a ``KVCheckInputError``.

    Attributes:
        runner: ``ModelConfig.runner_type``: ``generate`` or ``pooling``.
        is_causal: ``hf_config.is_causal`` (read for pooling models only).
        is_hybrid: ``ModelConfig.is_hybrid`` (attention and Mamba layers).
        is_attention_free: ``ModelConfig.is_attention_free`` (Mamba).
        is_encoder_decoder: ``ModelConfig.is_encoder_decoder`` (Whisper).
        enable_prefix_caching, enable_chunked_prefill: the user's ``EngineArgs`` (None: not
            given).
        seq_pooling_type, tok_pooling_type: 0.33 ``PoolerConfig``: the user's (None: the
            class default).
        default_seq_pooling_type, default_tok_pooling_type: 0.33 the pooling class's
            defaults (None: ``LAST`` / ``ALL``).
        model_attn_type: 0.33 the pooling class's ``attn_type`` (None: ``decoder``).
        non_causal_layers: 0.33 some layer's KV-cache spec has ``non_causal=True``.
        pooling_type: 0.10.2 ``PoolerConfig.pooling_type``: the user's (None: the default).
        default_pooling_type: 0.10.2 the pooling class's ``default_pooling_type`` (None:
            ``LAST``).
    """

    runner: str = "generate"
    is_causal: bool = True
    is_hybrid: bool = False
    is_attention_free: bool = False
    is_encoder_decoder: bool = False
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    seq_pooling_type: str | None = None
    tok_pooling_type: str | None = None
    default_seq_pooling_type: str | None = None
    default_tok_pooling_type: str | None = None
    model_attn_type: str | None = None
    non_causal_layers: bool = False
    pooling_type: str | None = None
    default_pooling_type: str | None = None


@dataclass(frozen=True)
class KVFeatureDefaults:
    """The settings the engine runs with (``cache_config.enable_prefix_caching``,
    ``scheduler_config`` chunked prefill) and the sorted codes (``FEATURE_OFF_REASONS``) of
    the rules that turned a feature off."""

    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    reasons: tuple[str, ...] = ()


def _check(model: KVModelFacts, profile: str) -> None:
    if not isinstance(model, KVModelFacts):
        raise KVCheckInputError(f"expected a KVModelFacts, got {type(model).__name__}")
    if model.runner not in RUNNERS:
        raise KVCheckInputError(f"runner={model.runner!r}: use one of {list(RUNNERS)} "
                                "(ModelConfig.runner_type)")
    for name in ("is_causal", "is_hybrid", "is_attention_free", "is_encoder_decoder",
                 "non_causal_layers"):
        if type(getattr(model, name)) is not bool:
            raise KVCheckInputError(f"{name}={getattr(model, name)!r} must be a bool")
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        if getattr(model, name) is not None and type(getattr(model, name)) is not bool:
            raise KVCheckInputError(f"{name}={getattr(model, name)!r} must be None (not "
                                    "given), True or False")
    lacking = _ONLY_033 if profile == "vllm-0.10" else _ONLY_010
    for name in lacking:
        if getattr(model, name) is not None:
            other = "vLLM 0.33" if profile == "vllm-0.10" else "vLLM 0.10.2"
            raise KVCheckInputError(f"{name} is a {other} field ({profile} has none): drop it "
                                    f"or use the other profile")
    if profile == "vllm-0.10" and model.non_causal_layers:
        raise KVCheckInputError("non_causal_layers: vLLM 0.10.2's KV-cache specs have no "
                                "non_causal field; drop it or use profile vllm-0.33")
    menus = {"seq_pooling_type": SEQ_POOLING_TYPES, "default_seq_pooling_type":
             SEQ_POOLING_TYPES, "tok_pooling_type": TOK_POOLING_TYPES,
             "default_tok_pooling_type": TOK_POOLING_TYPES, "model_attn_type": MODEL_ATTN_TYPES}
    for name, menu in menus.items():
        value = getattr(model, name)
        if value is not None and value not in menu:
            raise KVCheckInputError(f"{name}={value!r}: use one of {list(menu)} or None")
    for name in _ONLY_010:
        value = getattr(model, name)
        if value is not None and (not isinstance(value, str)
                                  or value.upper() not in POOLING_TYPES_0_10):
            raise KVCheckInputError(f"{name}={value!r}: use one of "
                                    f"{list(POOLING_TYPES_0_10)} or None (PoolingType)")


def _supported_033(model: KVModelFacts) -> tuple[bool, bool, str]:
    """``(chunked prefill, prefix caching, reason)``: ``is_chunked_prefill_supported``,
    ``is_prefix_caching_supported`` and the code of what made one False ("" if none)."""
    if model.runner == "pooling":
        default_seq = model.default_seq_pooling_type or "LAST"
        if default_seq == "CLS" or not model.is_causal:
            attn = "encoder_only"
        else:
            attn = model.model_attn_type or "decoder"
        if attn == "encoder_only":
            return False, False, "encoder_only"
        if attn == "decoder":
            seq = model.seq_pooling_type or default_seq
            tok = model.tok_pooling_type or model.default_tok_pooling_type or "ALL"
            if seq in ("MEAN", "CLS") or tok == "STEP":
                return False, False, "pooling_type"
            return True, True, ""
        return True, False, "attention_free"
    if model.is_hybrid:
        return True, True, ""
    if model.is_attention_free:
        return True, False, "attention_free"
    if model.is_encoder_decoder:
        return False, False, "encoder_decoder"
    return True, True, ""


def _user_or_default(choice: bool | None, supported: bool, why: str,
                     reasons: set[str]) -> bool:
    """0.33: the user's explicit choice wins; unset, the model's support decides. The reason
    for an off flag goes into ``reasons`` (``"user"`` for an explicit off)."""
    value = supported if choice is None else choice
    if not value:
        reasons.add(why if choice is None else "user")
    return value


def _rule_033(model: KVModelFacts, reasons: set[str]) -> tuple[bool, bool]:
    chunked_ok, prefix_ok, why = _supported_033(model)
    chunked = _user_or_default(model.enable_chunked_prefill, chunked_ok, why, reasons)
    prefix = _user_or_default(model.enable_prefix_caching, prefix_ok, why, reasons)
    if model.is_encoder_decoder:
        chunked = False
        reasons.add("encoder_decoder")
    mamba = model.is_hybrid or (model.is_attention_free and model.runner == "generate")
    if mamba and prefix and not chunked:
        raise KVCacheConfigError("Chunked prefill is required for Mamba prefix caching. (vLLM "
                                 "0.33 MambaModelConfig asserts: a hybrid or Mamba model with "
                                 "prefix caching on needs chunked prefill)")
    if model.non_causal_layers:
        chunked = prefix = False
        reasons.add("non_causal_layers")
    return prefix, chunked


def _rule_010(model: KVModelFacts, reasons: set[str]) -> tuple[bool, bool]:
    chunked, prefix = model.enable_chunked_prefill, model.enable_prefix_caching
    pooling = model.runner == "pooling"
    pooling_type = (model.pooling_type or model.default_pooling_type or "LAST").upper()
    if not pooling:
        chunked = True
        prefix = True if prefix is None else prefix
        if not prefix:
            reasons.add("user")
    else:
        incremental = pooling_type == "LAST" and model.is_causal
        if (chunked is False) or (prefix is False):
            reasons.add("user")
        chunked = incremental if chunked is None else chunked
        prefix = incremental if prefix is None else prefix
    if model.is_attention_free and not pooling:
        prefix = False
        reasons.add("attention_free")
    if model.is_hybrid:
        prefix = False
        reasons.add("hybrid")
    forced = []
    if pooling:
        if pooling_type != "LAST":
            forced.append("pooling_type")
        if not model.is_causal:
            forced.append("non_causal")
    elif model.is_encoder_decoder:
        forced.append("encoder_decoder")
    if forced:
        chunked = prefix = False
        reasons.update(forced)
    return prefix, chunked


def kv_feature_defaults(model: KVModelFacts, profile: str = "vllm-0.33") -> KVFeatureDefaults:
    """The prefix caching and chunked prefill ``model`` runs with under ``profile``'s vLLM
    (``"generic"`` is read as ``"vllm-0.33"``), and why a feature is off (module docstring).

    Raises:
        KVCheckInputError: an unknown profile, runner, pooling or attention type, a non-bool
            flag, or a field the profile's vLLM lacks.
        KVCacheConfigError: vLLM 0.33 asserts (a hybrid or Mamba model with prefix caching on
            and chunked prefill off).
    """
    if profile not in _PROFILES:
        raise KVCheckInputError(f"unknown profile {profile!r}; use one of {list(_PROFILES)}")
    profile = "vllm-0.33" if profile == "generic" else profile
    _check(model, profile)
    reasons: set[str] = set()
    if profile == "vllm-0.10":
        prefix, chunked = _rule_010(model, reasons)
    else:
        prefix, chunked = _rule_033(model, reasons)
    return KVFeatureDefaults(prefix, chunked, tuple(sorted(reasons)))
