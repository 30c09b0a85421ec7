"""megatron-core models built from the Megatron arguments: GPT, BERT and T5 (one pipeline stage).

The HF model config was turned into Megatron's network arguments by the config parsers
(`hasten.config.megatron_models`); here `args.py`'s pure mappings become megatron-core's
`GPTModel`, `BertModel` and `T5Model` with their layer specs: Transformer Engine layers when fp8
is on (megatron-core's fp8 runs in them), megatron-core's local layers otherwise. CUDA only, and
megatron-core is imported when a model is built.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from torch import nn

from hasten.strategies.megatron.args import (
    bert_model_kwargs,
    gpt_model_kwargs,
    t5_layer_counts,
    t5_model_kwargs,
    transformer_config_kwargs,
    uses_transformer_engine,
)

__all__ = ["MODEL_BUILDERS", "build_bert", "build_gpt", "build_t5"]


def _config(args: SimpleNamespace) -> Any:
    # optional: megatron-core
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs(args))


def build_gpt(args: SimpleNamespace, pre_process: bool, post_process: bool, **_: Any) -> nn.Module:
    """megatron-core's `GPTModel` (gpt2, llama, glm4_moe configs)."""
    # optional: megatron-core
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs

    config = _config(args)
    if uses_transformer_engine(args):
        spec = specs.get_gpt_layer_with_transformer_engine_spec(num_experts=config.num_moe_experts)
    else:
        spec = specs.get_gpt_layer_local_spec(
            num_experts=config.num_moe_experts, normalization=config.normalization
        )
    return GPTModel(
        config, spec, pre_process=pre_process, post_process=post_process, **gpt_model_kwargs(args)
    )


def build_bert(args: SimpleNamespace, pre_process: bool, post_process: bool, **_: Any) -> nn.Module:
    """megatron-core's `BertModel`: masked LM, with the sentence-order head if asked."""
    # optional: megatron-core
    from megatron.core.models.bert import bert_layer_specs as specs
    from megatron.core.models.bert.bert_model import BertModel

    kwargs = bert_model_kwargs(args)  # refuses classification models before building anything
    if uses_transformer_engine(args):
        spec = specs.get_bert_layer_with_transformer_engine_spec()
    else:
        spec = specs.bert_layer_local_spec
    return BertModel(
        config=_config(args),
        transformer_layer_spec=spec,
        pre_process=pre_process,
        post_process=post_process,
        **kwargs,
    )


def _t5_block_specs(args: SimpleNamespace, encoder_layers: int, decoder_layers: int) -> tuple:
    # optional: megatron-core
    from megatron.core.models.T5 import t5_spec

    if uses_transformer_engine(args):
        return (
            t5_spec.get_t5_encoder_with_transformer_engine_block_spec(encoder_layers),
            t5_spec.get_t5_decoder_with_transformer_engine_block_spec(decoder_layers),
        )
    encoder = t5_spec.get_t5_encoder_with_local_block_spec(encoder_layers)
    decoder = t5_spec.get_t5_decoder_with_local_block_spec(decoder_layers)
    for block in (encoder, decoder):
        if block.layer_norm is None:
            # The local block specs name TE's norm for the final layer norm (None without TE).
            block.layer_norm = t5_spec.LNImpl
    return encoder, decoder


def build_t5(
    args: SimpleNamespace,
    pre_process: bool,
    post_process: bool,
    add_encoder: bool = True,
    add_decoder: bool = True,
) -> nn.Module:
    """megatron-core's `T5Model`: encoder and decoder configs differ in their layer counts."""
    # optional: megatron-core
    from megatron.core.models.T5.t5_model import T5Model

    encoder_layers, decoder_layers = t5_layer_counts(args)
    config = _config(args)
    config.num_layers = decoder_layers
    encoder_config = copy.deepcopy(config)
    encoder_config.num_layers = encoder_layers
    encoder_spec, decoder_spec = _t5_block_specs(args, encoder_layers, decoder_layers)
    return T5Model(
        config=config,
        encoder_config=encoder_config,
        transformer_encoder_layer_spec=encoder_spec,
        transformer_decoder_layer_spec=decoder_spec,
        pre_process=pre_process,
        post_process=post_process,
        add_encoder=add_encoder,
        add_decoder=add_decoder,
        **t5_model_kwargs(args),
    )


#: ``args.model_type_name`` -> builder(args, pre_process, post_process, add_encoder, add_decoder).
MODEL_BUILDERS = {"gpt": build_gpt, "bert": build_bert, "t5": build_t5}
