"""Write offline stand-ins for the few hub repositories the ecosystem suites load most.

The trl and diffusers test suites load tiny models and data sets by hub id (for example
``trl-internal-testing/tiny-Qwen2ForCausalLM-2.5``). This machine reaches no model hub, so
without stand-ins nearly every one of those tests fails before it touches accelerate, on both
sides, and says nothing about hasten. This script builds small stand-ins from configs, with the
same class, sizes and dtype as the originals where those are public facts, and writes them into
the hub cache layout under ``$HF_HOME/hub`` (``refs/main`` -> ``snapshots/<commit>/...``), which
``huggingface_hub`` resolves with ``HF_HUB_OFFLINE=1``. Data sets are written as parquet files
per config in a dataset repository of the same cache.

The tokenizers are byte-level BPEs trained here on a small corpus: token ids differ from the real
ones, so tests that pin exact ids or texts fail on both sides (and are counted, not hidden).

Run it inside a scratch venv that has transformers, datasets, diffusers and trl installed:
``python hub_standins.py --trl-repo DIR --diffusers-repo DIR``. It is idempotent.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import runpy
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["main"]


def hub_dir() -> Path:
    """The hub cache root: ``$HF_HUB_CACHE`` or ``$HF_HOME/hub``."""
    cache = os.environ.get("HF_HUB_CACHE")  # noqa: TID251 - a standalone script, not hasten
    if cache:
        return Path(cache)
    return Path(os.environ.get("HF_HOME", str(Path.home() / ".cache/huggingface"))) / "hub"  # noqa: TID251


def write_repo(repo_id: str, kind: str, fill: Callable[[Path], None]) -> None:
    """Write one repository into the hub cache (skip if already there)."""
    root = hub_dir() / f"{kind}s--{repo_id.replace('/', '--')}"
    if (root / "refs" / "main").is_file():
        print(f"  have {kind} {repo_id}")
        return
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        fill(Path(tmp))
        snap = root / "snapshots" / commit
        if snap.exists():
            shutil.rmtree(snap)
        shutil.copytree(tmp, snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    print(f"  wrote {kind} {repo_id}")


# -- tokenizers -----------------------------------------------------------------------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What color is the sky? The sky is blue.",
    "Where is the cat? It sits on the mat, next to a red ball and a small blue box.",
    "Once upon a time there was a model that learned to count: one, two, three, four, five.",
    "Python is a programming language. Code should be simple, readable and explicit.",
    "Hello, how are you today? I am fine, thank you! Let's do more of those.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" # @ $ % & _ ~ ` ^ | \\",
]


def corpus_texts(extra: Iterable[str]) -> list[str]:
    """The training text of the stand-in BPEs: a fixed corpus plus the data sets' own strings."""
    return [*CORPUS, *extra] * 4


def byte_level_bpe(texts: list[str], vocab_size: int, specials: list[str]) -> Any:
    """A byte-level BPE (``tokenizers.Tokenizer``) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def trl_template(name: str) -> str:
    """A chat template that trl ships (``trl/chat_templates/<name>.jinja``) in this venv."""
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        raise SystemExit("trl is not installed in this venv: install it first")
    return (Path(spec.origin).parent / "chat_templates" / f"{name}.jinja").read_text()


def qwen2_tokenizer(texts: list[str]) -> Any:
    """A Qwen2.5-style tokenizer: Qwen's special tokens and trl's copy of its chat template."""
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=byte_level_bpe(texts, 640, specials),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
        model_max_length=32768,
    )
    tok.chat_template = trl_template("qwen2_5")
    return tok


def save_tokenizer(tok: Any, path: Path, tokenizer_class: str) -> None:
    tok.save_pretrained(path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = tokenizer_class
    cfg_path.write_text(json.dumps(cfg, indent=2))


# -- trl ------------------------------------------------------------------------------------------


def trl_models(texts: list[str]) -> None:
    """Qwen2.5 tiny causal LM and sequence classifier, as trl's generator scripts size them."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )

    tok = qwen2_tokenizer(texts)
    gen = GenerationConfig(
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id],
        pad_token_id=tok.pad_token_id,
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
    )

    def build(cls: type, **sizes: Any) -> Callable[[Path], None]:
        def fill(path: Path) -> None:
            torch.manual_seed(0)
            config = Qwen2Config(
                vocab_size=len(tok),
                num_attention_heads=4,
                num_key_value_heads=2,
                num_hidden_layers=2,
                intermediate_size=32,
                bos_token_id=gen.bos_token_id,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                tie_word_embeddings=False,
                **sizes,
            )
            model = cls(config).to(dtype=torch.bfloat16)
            for module in model.modules():  # as trl's generator: no NaNs from raw init
                if isinstance(module, torch.nn.Linear):
                    torch.nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        torch.nn.init.zeros_(module.bias)
                elif isinstance(module, torch.nn.Embedding):
                    torch.nn.init.normal_(module.weight, std=0.02)
            model.save_pretrained(path)
            save_tokenizer(tok, path, "Qwen2Tokenizer")
            gen.save_pretrained(path)

        return fill

    org = "trl-internal-testing"
    write_repo(f"{org}/tiny-Qwen2ForCausalLM-2.5", "model", build(Qwen2ForCausalLM, hidden_size=8))
    write_repo(
        f"{org}/tiny-Qwen2ForSequenceClassification-2.5",
        "model",
        build(Qwen2ForSequenceClassification, hidden_size=16, num_labels=1),
    )


def parquet_dataset(path: Path, configs: dict[str, Any]) -> None:
    """Write ``{config: DatasetDict}`` as ``<config>/<split>-00000-of-00001.parquet`` + card."""
    lines = ["---", "configs:"]
    for name, dd in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        for split, ds in dd.items():
            rel = f"{name}/{split}-00000-of-00001.parquet"
            (path / name).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(path / rel))
            lines += [f"  - split: {split}", f"    path: {rel}"]
    lines += ["---", ""]
    (path / "README.md").write_text("\n".join(lines))


def datasets_cache(repo_id: str, configs: dict[str, Any]) -> None:
    """Prepare each config in the datasets cache, where ``load_dataset`` looks when offline.

    With ``HF_HUB_OFFLINE=1``, ``datasets.load_dataset("<org>/<name>", config)`` reads only its own
    cache (``$HF_DATASETS_CACHE/<org>___<name>/<config>/<version>/<hash>/``), not the hub cache.
    """
    import datasets.config
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo_id.split("/")
    root = Path(datasets.config.HF_DATASETS_CACHE) / f"{org}___{name}"
    digest = hashlib.sha1(repo_id.encode()).hexdigest()[:16]
    for config, dd in configs.items():
        final = root / config / "0.0.0" / digest
        if final.is_dir():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for split, ds in dd.items():
                files[split] = [f"{tmp}/{split}.parquet"]
                ds.to_parquet(files[split][0])
            builder = Parquet(
                cache_dir=f"{tmp}/cache",
                dataset_name=name,
                config_name=config,
                hash=digest,
                data_files=files,
            )
            builder.download_and_prepare()
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(builder.cache_dir, final)
    print(f"  prepared {len(configs)} configs of {repo_id} in the datasets cache")


def capture_generator(script: Path, repo_id: str) -> dict[str, Any]:
    """Run one of trl's dataset generator scripts with ``push_to_hub`` captured, not sent."""
    import datasets

    captured: dict[str, Any] = {}

    def capture(self: Any, repo: str, config_name: str = "default", **_: Any) -> None:
        captured[config_name] = self if isinstance(self, datasets.DatasetDict) else {"train": self}

    saved = datasets.DatasetDict.push_to_hub, datasets.Dataset.push_to_hub
    datasets.DatasetDict.push_to_hub = capture  # type: ignore[method-assign,assignment]
    datasets.Dataset.push_to_hub = capture  # type: ignore[method-assign,assignment]
    argv = sys.argv
    try:
        sys.argv = [str(script), "--push_to_hub", "True", "--repo_id", repo_id]
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
        datasets.DatasetDict.push_to_hub, datasets.Dataset.push_to_hub = saved  # type: ignore[method-assign]
    return captured


def strings_of(configs: dict[str, Any]) -> list[str]:
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for dd in configs.values():
        for ds in dd.values():
            walk(ds.to_dict())
    return out


def trl_standins(trl_repo: Path) -> None:
    zen = capture_generator(
        trl_repo / "scripts" / "generate_zen_dataset.py", "trl-internal-testing/zen"
    )
    write_repo("trl-internal-testing/zen", "dataset", lambda p: parquet_dataset(p, zen))
    datasets_cache("trl-internal-testing/zen", zen)
    trl_models(corpus_texts(strings_of(zen)))


# -- diffusers ------------------------------------------------------------------------------------


def clip_tokenizer(path: Path, texts: list[str]) -> None:
    """A CLIP-style BPE (``</w>`` word ends, CLIP's start/end tokens) saved as vocab + merges."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        initial_alphabet=alphabet,
        end_of_word_suffix="</w>",
        special_tokens=["<|startoftext|>", "<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(texts + [f"{c}" for c in alphabet], trainer)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = tok.model.save(tmp)
        vocab = json.loads(Path(vocab_file).read_text())
        for c in alphabet:  # every byte, inside and at the end of a word
            for piece in (c, f"{c}</w>"):
                vocab.setdefault(piece, len(vocab))
        Path(vocab_file).write_text(json.dumps(vocab))
        clip = CLIPTokenizer(vocab_file, merges_file, model_max_length=77)
        clip.save_pretrained(path)


def tiny_stable_diffusion(path: Path) -> None:
    """A tiny Stable Diffusion 1.x pipeline: UNet, VAE, CLIP text encoder and tokenizer, scheduler."""
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    clip_tokenizer(path / "tokenizer", corpus_texts([]))
    from transformers import CLIPTokenizer

    vocab = len(CLIPTokenizer.from_pretrained(path / "tokenizer"))
    UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    ).save_pretrained(path / "unet")
    AutoencoderKL(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
    ).save_pretrained(path / "vae")
    CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=2,
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=5,
            pad_token_id=1,
            vocab_size=vocab,
        )
    ).save_pretrained(path / "text_encoder")
    PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True
    ).save_pretrained(path / "scheduler")
    del DDPMScheduler  # the examples load the scheduler folder as DDPMScheduler: same config keys
    (path / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionPipeline",
                "_diffusers_version": "0.42.1",
                "feature_extractor": [None, None],
                "requires_safety_checker": False,
                "safety_checker": [None, None],
                "scheduler": ["diffusers", "PNDMScheduler"],
                "text_encoder": ["transformers", "CLIPTextModel"],
                "tokenizer": ["transformers", "CLIPTokenizer"],
                "unet": ["diffusers", "UNet2DConditionModel"],
                "vae": ["diffusers", "AutoencoderKL"],
            },
            indent=2,
        )
    )


def ddpm_dummy(path: Path) -> None:
    """A small UNet2DModel config (what ``train_unconditional.py`` builds its model from)."""
    from diffusers import UNet2DModel

    UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    ).save_config(path)


def image_datasets() -> dict[str, dict[str, Any]]:
    """Two tiny image data sets: images with captions, and images with class labels (6 rows)."""
    import numpy as np
    from datasets import Dataset, Features, Image, Value
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    images = [
        PILImage.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(6)
    ]
    captions = [
        "a red ball",
        "a blue box",
        "a small cat",
        "a green tree",
        "a lazy dog",
        "a bright sky",
    ]
    text = Dataset.from_dict(
        {"image": images, "text": captions},
        features=Features({"image": Image(), "text": Value("string")}),
    )
    labels = Dataset.from_dict(
        {"image": images, "label": [0, 1, 0, 1, 0, 1]},
        features=Features({"image": Image(), "label": Value("int64")}),
    )
    return {
        "hf-internal-testing/dummy_image_text_data": {"default": {"train": text}},
        "hf-internal-testing/dummy_image_class_data": {"default": {"train": labels}},
    }


def diffusers_standins() -> None:
    write_repo("hf-internal-testing/tiny-stable-diffusion-torch", "model", tiny_stable_diffusion)
    write_repo("diffusers/ddpm_dummy", "model", ddpm_dummy)
    for repo_id, configs in image_datasets().items():
        write_repo(repo_id, "dataset", lambda p, c=configs: parquet_dataset(p, c))
        datasets_cache(repo_id, configs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-repo", type=Path, help="a checkout of trl (its scripts/ folder)")
    parser.add_argument(
        "--diffusers", action="store_true", help="the diffusers examples' stand-ins"
    )
    args = parser.parse_args(argv)
    print(f"hub stand-ins in {hub_dir()}")
    if args.trl_repo:
        trl_standins(args.trl_repo)
    if args.diffusers:
        diffusers_standins()


if __name__ == "__main__":
    main()
