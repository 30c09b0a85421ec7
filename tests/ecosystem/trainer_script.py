"""A transformers Trainer run on a tiny model built from a config (nothing downloaded).

Run by tests/ecosystem/test_trainer*.py, directly or through `accelerate launch`, with hasten
installed as `accelerate`. It trains, evaluates and saves; with --resume it continues from a
checkpoint. The main process prints one JSON line (prefixed RESULT) with the losses by step,
the eval loss, and what each process held of the model (to check that FSDP/DeepSpeed shard).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset


class Tokens(Dataset):
    """Random token sequences (causal LM) or sequences with a class label (classifier)."""

    def __init__(
        self, task: str, n: int, seed: int, length: int = 16, positions: bool = False
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 30, (n, length), generator=g)
        self.labels = (self.ids[:, 0] % 3) if task == "classifier" else self.ids
        self.positions = positions  # sequence parallelism shards them with the tokens

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.ids[i], "labels": self.labels[i]}
        if self.positions:
            item["position_ids"] = torch.arange(len(self.ids[i]))
        return item


def _holdings(trainer: object) -> dict[str, int]:
    """How many parameter elements this process holds, against the model's full size."""
    model = trainer.model_wrapped  # type: ignore[attr-defined]
    full = local = 0
    for param in model.parameters():
        if hasattr(param, "ds_numel"):  # DeepSpeed ZeRO-3: a partition of ds_numel
            full += param.ds_numel
            local += param.ds_tensor.numel()
        elif hasattr(param, "to_local"):  # FSDP2: a DTensor shard
            full += param.numel()
            local += param.to_local().numel()
        else:
            full += param.numel()
            local += param.numel()
    held = {"full": full, "params": local}
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # type: ignore[attr-defined]
    groups = getattr(optimizer, "single_partition_of_fp32_groups", None)  # ZeRO-1/2
    if groups is None:
        groups = getattr(optimizer, "fp32_partitioned_groups_flat", None)  # ZeRO-3
    if groups is not None:
        held["optimizer_fp32"] = sum(g.numel() for g in groups)
    return held


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=["causal", "classifier"], default="causal")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--save_steps", type=int, default=4)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--fsdp", default="")
    parser.add_argument("--fsdp_config", default=None)
    parser.add_argument("--deepspeed", default=None)
    parser.add_argument("--sp_size", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=4)
    return parser


def run(argv: list[str]) -> dict[str, Any] | None:
    """Train, evaluate, save; return the result on the main process (None on the others)."""
    import tiny
    from transformers import Trainer, TrainingArguments

    args = _parser().parse_args(argv)
    # Built before TrainingArguments: with a ZeRO-3 config those make transformers construct
    # models under deepspeed.zero.Init, whose partitioned embedding its weight init cannot index.
    build = tiny.classifier if args.task == "classifier" else tiny.causal_lm
    model = build(attn_implementation="sdpa") if args.sp_size > 1 else build()
    parallelism = None
    if args.sp_size > 1:  # DeepSpeed's Ulysses sequence parallelism
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils import DeepSpeedSequenceParallelConfig

        parallelism = ParallelismConfig(
            sp_size=args.sp_size,
            sp_backend="deepspeed",
            sp_handler=DeepSpeedSequenceParallelConfig(
                sp_seq_length_is_variable=True, sp_attn_implementation="sdpa"
            ),
        )
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_strategy="steps",
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        fsdp=args.fsdp,
        fsdp_config=json.loads(args.fsdp_config) if args.fsdp_config else None,
        deepspeed=json.loads(args.deepspeed) if args.deepspeed else None,
        parallelism_config=parallelism,
        disable_tqdm=True,
    )
    seen: list[int] = []  # the sequence length each forward of this process receives
    model.register_forward_pre_hook(
        lambda module, a, kw: seen.append(int(kw["input_ids"].shape[1])), with_kwargs=True
    )
    positions = args.sp_size > 1
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Tokens(args.task, 64, seed=1, positions=positions),
        eval_dataset=Tokens(args.task, 16, seed=2, positions=positions),
    )
    resumed_args = None
    saved_args = f"{args.resume}/training_args.bin" if args.resume else None
    if saved_args and os.path.exists(saved_args):
        # The checkpoint's training_args.bin, written by another process, reads back here. One
        # hasten cannot read is reported; the resume below does not read the file.
        try:
            saved = torch.load(saved_args, weights_only=False)
        except pickle.UnpicklingError as err:
            resumed_args = f"unreadable: {err}"
        else:
            resumed_args = type(saved.distributed_state).__module__
    trainer.train(resume_from_checkpoint=args.resume)
    held = _holdings(trainer)
    held["train_seq_lengths"] = sorted(set(seen))
    metrics = trainer.evaluate()
    trainer.save_model(f"{args.output_dir}/final")
    # The full weights, gathered from every process (save_model writes nothing under a
    # SHARDED_STATE_DICT: the checkpoint folders hold the shards).
    weights = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    everyone: list[Any] = [held]
    if dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, held)
    if not trainer.is_world_process_zero():
        return None
    import accelerate
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().cpu().contiguous() for k, v in weights.items()},
        f"{args.output_dir}/weights.safetensors",
    )
    return {
        "losses": {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h},
        "eval_loss": metrics["eval_loss"],
        "held": everyone,
        "accelerate_is_hasten": getattr(accelerate, "__hasten_version__", None) is not None,
        "accelerator": type(trainer.accelerator).__module__,
        "distributed_type": trainer.accelerator.distributed_type.value,
        "num_processes": trainer.accelerator.num_processes,
        "resumed_args_state": resumed_args,
    }


def main() -> None:
    """Run once per group of arguments (groups separated by ``--then``: one interpreter start
    for several runs); the main process prints a RESULT line for each."""
    argv, groups = sys.argv[1:], [[]]
    for arg in argv:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    for group in groups:
        result = run(group)
        if result is not None:
            print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
