"""Megatron-LM train steps: how a batch becomes model inputs, and how outputs become the loss.

A train step gives megatron-core's pipeline schedule three functions: ``get_batch`` (a data
iterator -> model inputs), ``forward_step`` (run the model on them) and ``loss_func`` (masked
mean of the per-token losses, averaged over the data-parallel group for logging). Batches are
Hugging Face style (``input_ids``, ``attention_mask``, ``labels``...), or Megatron dataset
samples (``text``) when ``megatron_dataset_flag`` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hasten.strategies.megatron.run import RunView

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "T5TrainStep",
    "causal_masks",
]


def _average(losses: list[torch.Tensor]) -> torch.Tensor:
    from hasten.strategies.megatron.engine import avg_losses_across_data_parallel_group

    return avg_losses_across_data_parallel_group(losses)


def _output_class(args: Any) -> Any:
    if not getattr(args, "model_return_dict", False):
        return None
    from hasten.core.imports import is_transformers_available

    if not is_transformers_available():
        return None
    # optional: transformers (only for the output type users of HF models expect)
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

    return CausalLMOutputWithCrossAttentions


def causal_masks(
    tokens: torch.Tensor, eod_token: int | None, eod_mask_loss: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-to-right attention mask (True = hidden), loss mask and position ids for ``tokens``."""
    batch, length = tokens.shape
    visible = torch.tril(torch.ones(length, length, device=tokens.device, dtype=torch.bool))
    attention_mask = (~visible).view(1, 1, length, length)
    loss_mask = torch.ones(batch, length, dtype=torch.float, device=tokens.device)
    if eod_mask_loss and eod_token is not None:
        loss_mask[tokens == eod_token] = 0.0
    position_ids = torch.arange(length, dtype=torch.long, device=tokens.device)
    return attention_mask, loss_mask, position_ids.unsqueeze(0).expand_as(tokens)


def _masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    mask = loss_mask.reshape(-1).float()
    return torch.sum(losses.float().reshape(-1) * mask) / mask.sum().clamp(min=1.0)


class AbstractTrainStep:
    """What a Megatron train step provides; subclasses fill in the three functions.

    Args:
        name: the step's name (shown in logs).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.model_output_class: Any = None

    def get_batch_func(
        self, accelerator: RunView, megatron_dataset_flag: bool
    ) -> Callable[..., Any]:
        """Return ``get_batch(data_iterator)`` -> the model's inputs."""
        raise NotImplementedError(f"{self.name} does not define get_batch_func")

    def get_forward_step_func(self) -> Callable[..., Any]:
        """Return ``forward_step(data_iterator, model)`` -> (output, loss function)."""
        raise NotImplementedError(f"{self.name} does not define get_forward_step_func")

    def get_loss_func(self, accelerator: RunView) -> Callable[..., Any]:
        """Return ``loss_func(..., output_tensor)`` -> (loss, {name: averaged loss})."""
        raise NotImplementedError(f"{self.name} does not define get_loss_func")


class GPTTrainStep(AbstractTrainStep):
    """Causal language modelling: labels are the inputs shifted by one token.

    Args:
        accelerator: the Accelerator (or the strategy's `MegatronRun`).
        args: Megatron's argument namespace (`hasten.strategies.megatron.args.megatron_args`).
    """

    def __init__(self, accelerator: RunView, args: Any) -> None:
        super().__init__("GPTTrainStep")
        self.eod_token = getattr(args, "eod_token_id", None)
        self.eod_mask_loss = bool(getattr(args, "eod_mask_loss", False))
        self.return_logits = bool(getattr(args, "return_logits", False))
        self.get_batch = self.get_batch_func(
            accelerator, getattr(args, "megatron_dataset_flag", False)
        )
        self.loss_func = self.get_loss_func(accelerator)
        self.forward_step = self.get_forward_step_func()
        self.model_output_class = _output_class(args)

    def get_batch_func(
        self, accelerator: RunView, megatron_dataset_flag: bool
    ) -> Callable[..., Any]:
        """Return the batch function for Megatron samples (``text``) or HF batches."""
        key = "text" if megatron_dataset_flag else "input_ids"

        def get_batch(data_iterator: Iterator[Any]) -> tuple[torch.Tensor, ...]:
            data = next(data_iterator) if data_iterator is not None else None
            tokens_ = _broadcast({key: data[key] if data is not None else None}, key)
            if not megatron_dataset_flag:
                # HF batches hold exactly the sequence: append one end token to shift against.
                pad = tokens_.new_full((tokens_.shape[0], 1), self.eod_token or 0)
                tokens_ = torch.cat([tokens_, pad], dim=1)
            labels = tokens_[:, 1:].contiguous()
            tokens = tokens_[:, :-1].contiguous()
            attention_mask, loss_mask, position_ids = causal_masks(
                tokens, self.eod_token, self.eod_mask_loss
            )
            return tokens, labels, loss_mask, attention_mask, position_ids

        return get_batch

    def get_loss_func(self, accelerator: RunView) -> Callable[..., Any]:
        """Return the masked-mean LM loss (with logits when ``return_logits``)."""

        def loss_func(loss_mask: torch.Tensor, output_tensor: Any) -> tuple[torch.Tensor, dict]:
            logits = None
            if isinstance(output_tensor, tuple):
                output_tensor, logits = output_tensor
            loss = _masked_mean(output_tensor, loss_mask)
            report: dict[str, Any] = {"lm loss": _average([loss])[0]}
            if self.return_logits and logits is not None:
                report["logits"] = logits
            return loss, report

        return loss_func

    def get_forward_step_func(self) -> Callable[..., Any]:
        """Return the forward step: inputs -> per-token losses, with the bound loss function."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Callable]:
            tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
            output = model(tokens, position_ids, attention_mask, labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step


def _broadcast(data: dict[str, Any], key: str) -> torch.Tensor:
    """Send the batch from tensor-parallel rank 0 to its group (a no-op without Megatron)."""
    from hasten.strategies.megatron.engine import broadcast_tensor_parallel

    return broadcast_tensor_parallel(data, [key])[key].long()


class BertTrainStep(AbstractTrainStep):
    """Masked language modelling (+ sentence order) or sequence classification with BERT.

    Args:
        accelerator: the Accelerator (or the strategy's `MegatronRun`).
        args: Megatron's argument namespace.
    """

    _KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label")

    def __init__(self, accelerator: RunView, args: Any) -> None:
        super().__init__("BertTrainStep")
        self.pretraining = bool(getattr(args, "pretraining_flag", True))
        self.num_labels = int(getattr(args, "num_labels", 2) or 2)
        self.get_batch = self.get_batch_func(
            accelerator, getattr(args, "megatron_dataset_flag", False)
        )
        self.loss_func = self.get_loss_func(accelerator)
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(
        self, accelerator: RunView, megatron_dataset_flag: bool
    ) -> Callable[..., Any]:
        """Return the batch function: tokens, types, labels, loss mask, padding mask, SOP labels."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[Any, ...]:
            data = next(data_iterator)
            tokens = data["input_ids"].long()
            padding_mask = data.get("attention_mask", torch.ones_like(tokens)).long()
            types = data.get("token_type_ids", torch.zeros_like(tokens)).long()
            labels = data.get("labels")
            loss_mask = None
            if labels is not None and labels.dim() > 1:
                loss_mask = (labels != -100).float()
                # megatron-core's vocab-parallel cross entropy needs valid ids; the mask hides them.
                labels = labels.long().masked_fill(labels == -100, 0)
            sentence_order = data.get("next_sentence_label")
            return tokens, types, sentence_order, loss_mask, labels, padding_mask

        return get_batch

    def get_loss_func(self, accelerator: RunView) -> Callable[..., Any]:
        """Return the MLM (+ SOP) loss, or the classification loss when not pretraining."""

        def pretraining_loss(loss_mask: Any, sentence_order: Any, output_tensor: Any) -> tuple:
            lm_losses, sop_logits = output_tensor
            lm_loss = _masked_mean(lm_losses, loss_mask)
            if sop_logits is None or sentence_order is None:
                return lm_loss, {"lm loss": _average([lm_loss])[0]}
            sop = torch.nn.functional.cross_entropy(
                sop_logits.view(-1, 2).float(), sentence_order.view(-1), ignore_index=-1
            )
            averaged = _average([lm_loss, sop])
            return lm_loss + sop, {"lm loss": averaged[0], "sop loss": averaged[1]}

        def classification_loss(labels: torch.Tensor, logits: torch.Tensor) -> tuple:
            if self.num_labels == 1:
                loss = torch.nn.functional.mse_loss(
                    logits.view(-1).float(), labels.view(-1).float()
                )
            else:
                loss = torch.nn.functional.cross_entropy(
                    logits.view(-1, self.num_labels).float(), labels.view(-1)
                )
            return loss, {"loss": _average([loss])[0]}

        return pretraining_loss if self.pretraining else classification_loss

    def get_forward_step_func(self) -> Callable[..., Any]:
        """Return the forward step for BERT."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Callable]:
            tokens, types, sentence_order, loss_mask, labels, padding_mask = self.get_batch(
                data_iterator
            )
            if not self.pretraining:
                return model(tokens, padding_mask, tokentype_ids=types), partial(
                    self.loss_func, labels
                )
            output = model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask, sentence_order)

        return forward_step


class T5TrainStep(AbstractTrainStep):
    """Sequence-to-sequence training with T5: encoder inputs, shifted decoder inputs, labels.

    Args:
        accelerator: the Accelerator (or the strategy's `MegatronRun`).
        args: Megatron's argument namespace.
    """

    def __init__(self, accelerator: RunView, args: Any) -> None:
        super().__init__("T5TrainStep")
        self.decoder_start = int(getattr(args, "decoder_start_token_id", 0) or 0)
        self.get_batch = self.get_batch_func(
            accelerator, getattr(args, "megatron_dataset_flag", False)
        )
        self.loss_func = self.get_loss_func(accelerator)
        self.forward_step = self.get_forward_step_func()

    @staticmethod
    def attn_mask_postprocess(attention_mask: torch.Tensor) -> torch.Tensor:
        """[b, s] padding mask (1 = token) -> [b, 1, s, s] mask with True where hidden."""
        visible = attention_mask.unsqueeze(1) * attention_mask.unsqueeze(2)
        return (visible < 0.5).unsqueeze(1)

    @staticmethod
    def get_decoder_mask(seq_length: int, device: torch.device) -> torch.Tensor:
        """[1, s, s] causal mask with True where hidden."""
        return (
            ~torch.tril(torch.ones(seq_length, seq_length, device=device, dtype=torch.bool))
        ).unsqueeze(0)

    @staticmethod
    def get_enc_dec_mask(
        attention_mask: torch.Tensor, dec_seq_length: int, device: torch.device
    ) -> torch.Tensor:
        """[b, 1, dec, enc] mask hiding the encoder's padding from the decoder."""
        batch, enc = attention_mask.shape
        visible = attention_mask.unsqueeze(1).expand(batch, dec_seq_length, enc).to(device)
        return (visible < 0.5).unsqueeze(1)

    def get_batch_func(
        self, accelerator: RunView, megatron_dataset_flag: bool
    ) -> Callable[..., Any]:
        """Return the batch function for HF seq2seq batches (``input_ids``, ``labels``, and
        ``decoder_input_ids`` if given; else the labels shifted right after the start token)."""

        def get_batch(data_iterator: Iterator[Any]) -> tuple[torch.Tensor, ...]:
            data = next(data_iterator)
            tokens_enc = data["input_ids"].long()
            labels = data["labels"].long()
            loss_mask = (labels != -100).float()
            safe = labels.masked_fill(labels == -100, 0)
            tokens_dec = data.get("decoder_input_ids")
            if tokens_dec is None:
                start = safe.new_full((safe.shape[0], 1), self.decoder_start)
                tokens_dec = torch.cat([start, safe[:, :-1]], dim=1)
            tokens_dec = tokens_dec.long()
            enc_padding = data.get("attention_mask", torch.ones_like(tokens_enc))
            enc_mask = self.attn_mask_postprocess(enc_padding)
            dec_mask = self.get_decoder_mask(tokens_dec.shape[1], tokens_dec.device)
            enc_dec_mask = self.get_enc_dec_mask(
                enc_padding, tokens_dec.shape[1], tokens_dec.device
            )
            return tokens_enc, tokens_dec, safe, loss_mask, enc_mask, dec_mask, enc_dec_mask

        return get_batch

    def get_loss_func(self, accelerator: RunView) -> Callable[..., Any]:
        """Return the masked-mean LM loss of the decoder."""

        def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple:
            loss = _masked_mean(output_tensor, loss_mask)
            return loss, {"lm loss": _average([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[..., Any]:
        """Return the forward step for T5."""

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Any, Callable]:
            enc, dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = self.get_batch(
                data_iterator
            )
            output = model(enc, dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step
