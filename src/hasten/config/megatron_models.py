"""Model-config parsers: a Hugging Face model's config -> the Megatron-LM network arguments.

`MegatronLMPlugin.set_network_size_args` picks the parser registered for the model's
``config.model_type`` (``add_model_config_to_megatron_parser``) and writes layer counts, sizes,
sequence length and vocabulary into ``megatron_lm_default_args``. Pure: reads configs only.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

__all__ = [
    "MODEL_CONFIGS_TO_MEGATRON_PARSERS",
    "add_model_config_to_megatron_parser",
    "parse_bert_config",
    "parse_glm4_moe_config",
    "parse_gpt2_config",
    "parse_llama_config",
    "parse_t5_config",
]

#: ``config.model_type`` (or a part of it) -> parser(plugin, model, batch_data).
MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Callable[..., None]] = {}


def add_model_config_to_megatron_parser(model_type: str) -> Callable[..., Any]:
    """Decorator registering a parser for models whose ``config.model_type`` contains it."""

    def register(func: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            func(*args, **kwargs)

        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = func
        return wrapper

    return register


def _seq_length(plugin: Any, preferred: str, batch_data: Any, key: str, fallback: int) -> int:
    """``preferred`` (encoder/decoder_seq_length) beats ``seq_length``, then the batch, then the
    model's maximum."""
    chosen = getattr(plugin, preferred)
    if plugin.seq_length is not None and chosen is not None and chosen != plugin.seq_length:
        warnings.warn(
            f"MegatronLMPlugin: both seq_length and {preferred} are set; using {preferred}",
            UserWarning,
            stacklevel=3,
        )
    if chosen is None:
        chosen = plugin.seq_length
    if chosen is None and batch_data is not None and key in batch_data:
        chosen = int(batch_data[key].shape[1])
    return int(chosen if chosen is not None else fallback)


def _record(plugin: Any, model: Any, **values: Any) -> None:
    args = plugin.megatron_lm_default_args
    args.update(values)
    args["model_return_dict"] = getattr(model.config, "return_dict", True)
    args["eod_token_id"] = getattr(model.config, "eos_token_id", None)
    plugin.seq_length = args["seq_length"]


@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Megatron-BERT: encoder sizes; masked-LM and pretraining models are pretraining models,
    and only a pretraining model (next-sentence head) gets Megatron's binary head by default."""
    config = model.config
    name = type(model).__name__.lower()
    args = megatron_lm_plugin.megatron_lm_default_args
    args.setdefault("bert_binary_head", "pretraining" in name)
    _record(
        megatron_lm_plugin,
        model,
        model_type_name="bert",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
        max_position_embeddings=config.max_position_embeddings,
        num_tokentypes=getattr(config, "type_vocab_size", 2),
        num_labels=config.num_labels,
        orig_vocab_size=config.vocab_size,
        pretraining_flag="maskedlm" in name or "pretraining" in name,
        seq_length=_seq_length(
            megatron_lm_plugin,
            "encoder_seq_length",
            batch_data,
            "input_ids",
            config.max_position_embeddings,
        ),
    )


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """GPT-2: decoder sizes, learned absolute positions, tied embeddings."""
    config = model.config
    _record(
        megatron_lm_plugin,
        model,
        model_type_name="gpt",
        num_layers=config.n_layer,
        hidden_size=config.n_embd,
        num_attention_heads=config.n_head,
        max_position_embeddings=config.n_positions,
        orig_vocab_size=config.vocab_size,
        pretraining_flag=True,
        return_logits=megatron_lm_plugin.return_logits,
        tokenizer_type="GPT2BPETokenizer",
        ffn_hidden_size=getattr(config, "n_inner", None) or 4 * config.n_embd,
        seq_length=_seq_length(
            megatron_lm_plugin, "decoder_seq_length", batch_data, "input_ids", config.n_positions
        ),
    )


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """T5: encoder-decoder sizes; encoder length from ``input_ids``, decoder from ``labels``."""
    config = model.config
    max_positions = getattr(config, "n_positions", 1024)
    encoder = _seq_length(megatron_lm_plugin, "encoder_seq_length", batch_data, "input_ids", 512)
    decoder = megatron_lm_plugin.decoder_seq_length
    if decoder is None and batch_data is not None and "labels" in batch_data:
        decoder = int(batch_data["labels"].shape[1])
    megatron_lm_plugin.encoder_seq_length = encoder
    megatron_lm_plugin.decoder_seq_length = decoder if decoder is not None else encoder
    _record(
        megatron_lm_plugin,
        model,
        model_type_name="t5",
        num_layers=config.num_layers,
        hidden_size=config.d_model,
        num_attention_heads=config.num_heads,
        max_position_embeddings=max_positions,
        orig_vocab_size=config.vocab_size,
        pretraining_flag=True,
        ffn_hidden_size=getattr(config, "d_ff", None) or 4 * config.d_model,
        kv_channels=getattr(config, "d_kv", None) or config.d_model // config.num_heads,
        encoder_num_layers=config.num_layers,
        decoder_num_layers=getattr(config, "num_decoder_layers", None) or config.num_layers,
        decoder_start_token_id=getattr(config, "decoder_start_token_id", None) or 0,
        seq_length=encoder,
        encoder_seq_length=encoder,
        decoder_seq_length=megatron_lm_plugin.decoder_seq_length,
    )


def _llama_like(plugin: Any, model: Any, batch_data: Any, **extra: Any) -> None:
    config = model.config
    heads = config.num_attention_heads
    _record(
        plugin,
        model,
        model_type_name="gpt",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(config, "num_key_value_heads", None) or heads,
        ffn_hidden_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        orig_vocab_size=config.vocab_size,
        pretraining_flag=True,
        normalization="RMSNorm",
        norm_epsilon=getattr(config, "rms_norm_eps", 1e-5),
        swiglu=True,
        position_embedding_type="rope",
        rotary_base=getattr(config, "rope_theta", 10000),
        untie_embeddings_and_output_weights=not getattr(config, "tie_word_embeddings", False),
        add_bias_linear=False,
        tokenizer_type="Llama2Tokenizer",
        seq_length=_seq_length(
            plugin,
            "decoder_seq_length",
            batch_data,
            "input_ids",
            getattr(config, "max_sequence_length", None) or config.max_position_embeddings,
        ),
        **extra,
    )


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Llama: RMSNorm, SwiGLU, rotary positions, grouped-query attention."""
    _llama_like(megatron_lm_plugin, model, batch_data)


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """GLM-4 MoE: the Llama layout plus routed experts."""
    config = model.config
    _llama_like(
        megatron_lm_plugin,
        model,
        batch_data,
        num_experts=getattr(config, "n_routed_experts", None),
        moe_router_topk=getattr(config, "num_experts_per_tok", 2),
        moe_ffn_hidden_size=getattr(config, "moe_intermediate_size", None),
        moe_shared_expert_intermediate_size=(
            getattr(config, "moe_intermediate_size", 0) * getattr(config, "n_shared_experts", 0)
            or None
        ),
        tokenizer_type="HuggingFaceTokenizer",
    )
