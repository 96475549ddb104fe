"""The installed vLLM's own rule for which KV-cache features a model runs with
(``SupportsSizing.kv_feature_defaults``): prefix caching and chunked prefill, and what turned
them off.

Answers come from vLLM's code, called on small stand-ins for its config objects; where the
rule sits inside a method that cannot run in isolation, the minimum is reproduced here and
the lines are named. Never from kvcheck's reference (that would check it against itself).

* vLLM 0.33: ``ModelConfig.attn_type`` / ``is_chunked_prefill_supported`` /
  ``is_prefix_caching_supported`` / ``is_hybrid`` / ``is_attention_free`` (vLLM's properties,
  on a stand-in holding the fields they read), then
  ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``, a real
  ``PoolerConfig`` (its validation of the pooling types) and a real ``SchedulerConfig``
  (its ``__post_init__`` turns an encoder-decoder model's chunked prefill off), then
  ``MambaModelConfig.verify_and_update_config`` for hybrid and Mamba models (its assertion);
  the non-causal-layer rule of ``EngineCore._initialize_kv_caches`` is reproduced on a real
  ``FullAttentionSpec`` (``v1/engine/core.py:259-280``).
* vLLM 0.10.2: ``EngineArgs._set_default_args_v1`` on a stand-in, ``MambaModelConfig``
  for hybrid and Mamba models; the pooler's default (``config/__init__.py:910-912``) and the
  ``disable_chunked_prefill_reasons`` block of ``VllmConfig.__post_init__``
  (``config/__init__.py:3443-3484``) are reproduced.

The release is told by which of the two ``EngineArgs`` methods the installed vLLM has; a
profile other than the installed release's raises ``UnsupportedSpec``. Importing this module
imports vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import fields
from types import SimpleNamespace

from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.conformance.sizing_protocol import KVFeatureDefaults, KVModelFacts
from kvcheck.errors import KVCheckInputError

if importlib.util.find_spec("vllm") is None:
    raise ImportError("vLLM is not installed in this environment; build one with "
                      "scripts/vllm-cpu-env.sh VERSION DIR (kvcheck.adapters."
                      "vllm_feature_defaults calls vLLM's own configuration code)")

__all__ = ["FEATURE_PROFILE", "kv_feature_defaults"]

_EngineArgs = importlib.import_module("vllm.engine.arg_utils").EngineArgs
_models_config = importlib.import_module("vllm.model_executor.models.config")
#: The release whose rule the installed vLLM has (None: neither 0.33's nor 0.10.2's).
FEATURE_PROFILE: str | None = (
    "vllm-0.33" if hasattr(_EngineArgs, "_set_default_chunked_prefill_and_prefix_caching_args")
    else "vllm-0.10" if hasattr(_EngineArgs, "_set_default_args_v1") else None)
_RUNNERS = ("generate", "pooling")
#: The attn_type values vLLM 0.33's pooling model classes declare (interfaces_base.attn_type).
_POOLING_ATTN_TYPES = ("decoder", "encoder_only", "attention_free")
_ONLY_033 = ("seq_pooling_type", "tok_pooling_type", "default_seq_pooling_type",
             "default_tok_pooling_type", "model_attn_type")
_ONLY_010 = ("pooling_type", "default_pooling_type")
_MAX_MODEL_LEN = 4096
#: An attention-free generate model of either release is a Mamba architecture (the
#: IsAttentionFree generate classes), which MODELS_CONFIG_MAP sends to MambaModelConfig.
_MAMBA_ARCH = "MambaForCausalLM"


def _check(model: KVModelFacts, profile: str) -> None:
    wanted = "vllm-0.33" if profile == "generic" else profile
    if FEATURE_PROFILE is None or wanted != FEATURE_PROFILE:
        raise UnsupportedSpec(f"the installed vLLM decides prefix caching and chunked prefill "
                              f"as {FEATURE_PROFILE}, not {profile}")
    if not isinstance(model, KVModelFacts):
        raise KVCheckInputError(f"expected a KVModelFacts, got {type(model).__name__}")
    if model.runner not in _RUNNERS:
        raise KVCheckInputError(f"runner={model.runner!r}: vLLM's runner_type here is one of "
                                f"{list(_RUNNERS)}")
    for f in fields(model):
        value = getattr(model, f.name)
        if f.name.startswith(("is_", "non_causal")) and type(value) is not bool:
            raise KVCheckInputError(f"{f.name}={value!r} must be a bool")
        if f.name.startswith("enable_") and value is not None and type(value) is not bool:
            raise KVCheckInputError(f"{f.name}={value!r} must be None, True or False")
    lacking = _ONLY_010 if FEATURE_PROFILE == "vllm-0.33" else (*_ONLY_033, "non_causal_layers")
    for name in lacking:
        if getattr(model, name) not in (None, False):
            raise KVCheckInputError(f"{name}: the installed vLLM ({FEATURE_PROFILE}) has no "
                                    "such setting; drop it or use the other profile")


def _pooler_033(model: KVModelFacts) -> tuple[object, SimpleNamespace]:
    """A real 0.33 ``PoolerConfig`` (resolved as ``ModelConfig`` does, ``config/model.py:
    795-802``) and the model-info fields ``attn_type`` reads."""
    pooler_cls = importlib.import_module("vllm.config.pooler").PoolerConfig
    try:
        defaults = pooler_cls(seq_pooling_type=model.default_seq_pooling_type or "LAST",
                              tok_pooling_type=model.default_tok_pooling_type or "ALL")
        pooler = pooler_cls(seq_pooling_type=model.seq_pooling_type or defaults.seq_pooling_type,
                            tok_pooling_type=model.tok_pooling_type or defaults.tok_pooling_type)
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise KVCheckInputError(f"vLLM's PoolerConfig rejects the pooling types "
                                f"(seq_pooling_type / tok_pooling_type or their defaults): "
                                f"{exc}") from None
    attn = model.model_attn_type or "decoder"
    if attn not in _POOLING_ATTN_TYPES:
        raise KVCheckInputError(f"model_attn_type={attn!r}: use one of "
                                f"{list(_POOLING_ATTN_TYPES)} (a pooling class's attn_type)")
    info = SimpleNamespace(default_seq_pooling_type=defaults.seq_pooling_type,
                           default_tok_pooling_type=defaults.tok_pooling_type,
                           attn_type=attn, is_hybrid=model.is_hybrid,
                           is_attention_free=model.is_attention_free)
    return pooler, info


def _rule_033(model: KVModelFacts, reasons: set[str]) -> tuple[bool, bool]:
    model_config_cls = importlib.import_module("vllm.config.model").ModelConfig
    scheduler_cls = importlib.import_module("vllm.config").SchedulerConfig

    class ModelConfigStandIn:
        """vLLM's own properties over the fields they read."""

        attn_type = model_config_cls.attn_type
        is_chunked_prefill_supported = model_config_cls.is_chunked_prefill_supported
        is_prefix_caching_supported = model_config_cls.is_prefix_caching_supported
        is_hybrid = model_config_cls.is_hybrid
        is_attention_free = model_config_cls.is_attention_free

    config = ModelConfigStandIn()
    pooler, info = _pooler_033(model)
    config.__dict__.update(
        runner_type=model.runner, pooler_config=pooler if model.runner == "pooling" else None,
        _model_info=info, hf_config=SimpleNamespace(is_causal=model.is_causal),
        is_encoder_decoder=model.is_encoder_decoder)
    args = SimpleNamespace(enable_chunked_prefill=model.enable_chunked_prefill,
                           enable_prefix_caching=model.enable_prefix_caching)
    _EngineArgs._set_default_chunked_prefill_and_prefix_caching_args(args, config)
    attn = str(config.attn_type)  # vLLM's property
    code = "pooling_type" if model.runner == "pooling" and attn == "decoder" else attn
    for user, now in ((model.enable_chunked_prefill, args.enable_chunked_prefill),
                      (model.enable_prefix_caching, args.enable_prefix_caching)):
        if not now:
            reasons.add("user" if user is False else code)
    scheduler = scheduler_cls(max_model_len=_MAX_MODEL_LEN,
                              is_encoder_decoder=model.is_encoder_decoder,
                              runner_type=model.runner,
                              enable_chunked_prefill=bool(args.enable_chunked_prefill),
                              max_num_batched_tokens=2 * _MAX_MODEL_LEN)
    if model.is_encoder_decoder:  # the condition of SchedulerConfig.__post_init__'s rule
        reasons.add("encoder_decoder")
    prefix, chunked = bool(args.enable_prefix_caching), bool(scheduler.enable_chunked_prefill)
    if bool(config.is_hybrid) or (  # vLLM's property
            model.is_attention_free and model.runner == "generate"):
        vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(architecture=_MAMBA_ARCH,
                                         max_model_len=_MAX_MODEL_LEN),
            cache_config=SimpleNamespace(enable_prefix_caching=prefix, mamba_cache_mode="none",
                                         mamba_block_size=None, block_size=16),
            scheduler_config=scheduler)
        # MODELS_CONFIG_MAP's entry for the Mamba architectures, and the first step of
        # HybridAttentionMambaModelConfig (config/vllm.py:2766-2767, models/config.py:599).
        try:
            _models_config.MODELS_CONFIG_MAP[_MAMBA_ARCH].verify_and_update_config(vllm_config)
        except AssertionError as exc:
            raise KVCheckInputError(f"vLLM 0.33's MambaModelConfig asserts: {exc}") from None
    # EngineCore._initialize_kv_caches (v1/engine/core.py:259-280) runs inside the engine's
    # start-up, so its rule is reproduced here over a real FullAttentionSpec carrying the flag.
    kvi = importlib.import_module("vllm.v1.kv_cache_interface")
    torch = importlib.import_module("torch")
    spec = kvi.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64,
                                 dtype=torch.bfloat16, non_causal=model.non_causal_layers)
    if getattr(spec, "non_causal", False):
        prefix = chunked = False
        reasons.add("non_causal_layers")
    return prefix, chunked


def _rule_010(model: KVModelFacts, reasons: set[str]) -> tuple[bool, bool]:
    pooling = model.runner == "pooling"
    pooling_types = importlib.import_module("vllm.model_executor.layers.pooler").PoolingType
    for name in _ONLY_010:
        value = getattr(model, name)
        if value is not None and (not isinstance(value, str)
                                  or value.upper() not in pooling_types.__members__):
            raise KVCheckInputError(f"{name}={value!r}: vLLM 0.10.2's PoolingType has "
                                    f"{list(pooling_types.__members__)}")
    pooler_cls = importlib.import_module("vllm.config").PoolerConfig
    # ModelConfig._init_pooler_config (config/__init__.py:910-912) reads the model's files
    # first; its last step, the class default for a pooling_type left None, is this.
    pooler = pooler_cls(pooling_type=model.pooling_type or model.default_pooling_type or "LAST")
    model_config = SimpleNamespace(
        runner_type=model.runner, pooler_config=pooler if pooling else None,
        hf_config=SimpleNamespace(is_causal=model.is_causal), max_model_len=_MAX_MODEL_LEN)
    args = SimpleNamespace(enable_chunked_prefill=model.enable_chunked_prefill,
                           enable_prefix_caching=model.enable_prefix_caching,
                           scheduler_cls=_EngineArgs.scheduler_cls,
                           max_num_batched_tokens=2 * _MAX_MODEL_LEN, max_num_seqs=256,
                           pipeline_parallel_size=1, tensor_parallel_size=1)
    _EngineArgs._set_default_args_v1(args, None, model_config)
    if (model.enable_chunked_prefill is False and args.enable_chunked_prefill is False) or (
            model.enable_prefix_caching is False and args.enable_prefix_caching is False):
        reasons.add("user")
    prefix, chunked = bool(args.enable_prefix_caching), bool(args.enable_chunked_prefill)
    mamba = _models_config.MambaModelConfig
    # try_verify_and_update_config (config/__init__.py:3690-3701): the architecture's entry of
    # MODELS_CONFIG_MAP, then for a hybrid model HybridAttentionMambaModelConfig, whose first
    # step is MambaModelConfig (its rest sizes pages).
    for applies, code, verifier in (
            (model.is_attention_free and not pooling, "attention_free",
             _models_config.MODELS_CONFIG_MAP[_MAMBA_ARCH]),
            (model.is_hybrid, "hybrid", mamba)):
        if applies:
            vllm_config = SimpleNamespace(
                model_config=SimpleNamespace(architecture=_MAMBA_ARCH),
                cache_config=SimpleNamespace(enable_prefix_caching=prefix),
                compilation_config=SimpleNamespace(cudagraph_mode="set"))
            verifier.verify_and_update_config(vllm_config)
            prefix = bool(vllm_config.cache_config.enable_prefix_caching)
            reasons.add(code)
    # VllmConfig.__post_init__'s disable_chunked_prefill_reasons (config/__init__.py:
    # 3443-3484) sits inside the whole config's construction; reproduced.
    forced = []
    if pooling:
        if pooler.pooling_type is None or pooler.pooling_type.lower() != "last":
            forced.append("pooling_type")
        if not getattr(model_config.hf_config, "is_causal", True):
            forced.append("non_causal")
    elif model.is_encoder_decoder:
        forced.append("encoder_decoder")
    if forced:
        prefix = chunked = False
        reasons.update(forced)
    return prefix, chunked


def kv_feature_defaults(model: KVModelFacts, profile: str) -> KVFeatureDefaults:
    """``SupportsSizing.kv_feature_defaults`` as the installed vLLM decides it."""
    _check(model, profile)
    reasons: set[str] = set()
    if FEATURE_PROFILE == "vllm-0.33":
        prefix, chunked = _rule_033(model, reasons)
    else:
        prefix, chunked = _rule_010(model, reasons)
    return KVFeatureDefaults(prefix, chunked, tuple(sorted(reasons)))
