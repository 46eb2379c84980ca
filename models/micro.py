"""The micro LLaVA-OneVision: the real architecture at toy size, trained on CPU by `scripts/train_micro.py`
to answer `hermes.datasets.synthetic_bench` streams, so memory policies can be compared for accuracy
without a GPU. Its weights file is self-contained (docs/ARCHITECTURE.md, Models) and checked against
`WEIGHTS_SHA256` on every load."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hermes.errors import ModelError

MICRO_NAME = "micro-llava-onevision"  # the builtin id (`--model micro-llava-onevision`)
MICRO_IMAGE_SIZE_PX = 28  # 7 x 7 patches of 4 px, pooled 2x2 (ceil) to 4 x 4 = 16 tokens per frame
MICRO_HIDDEN_SIZE = 64
MICRO_NUM_LAYERS = 4
MICRO_HEAD_DIM = 16
MICRO_STREAM_FPS = 1.0  # the synthetic world changes once per second
WEIGHTS_FILE = Path(__file__).resolve().parent / "weights" / "micro-llava-ov.safetensors"
# sha256 of WEIGHTS_FILE, written by `scripts/train_micro.py --out models/weights/micro-llava-ov.safetensors`.
WEIGHTS_SHA256 = "c2186b302f2af26112295d462baea00b263f5b491363c6bf042662762adc49ec"

# Header keys of the weights file (safetensors metadata is a str -> str map).
META_CONFIG = "llava_onevision_config"
META_TOKENIZER = "tokenizer_json"
META_SPECIAL_TOKENS = "additional_special_tokens"
META_TRAINING = "training"


def build_micro(seed: int = 0, hidden_size: int = MICRO_HIDDEN_SIZE, num_layers: int = MICRO_NUM_LAYERS,
                head_dim: int = MICRO_HEAD_DIM):
    """The untrained micro model (`tiny_llava_onevision` at the micro sizes): (model, tokenizer), fp32 eval
    mode on the CPU, its weights seeded by `seed`.

    Args:
        hidden_size, num_layers: the language model's width and depth (a larger micro model, issue 37);
            a weights file records its own, so `load_micro` reads any.
        head_dim: dims per attention head (`hidden_size` / `head_dim` heads, half as many KV heads).
    """
    from hermes.models.tiny import tiny_llava_onevision

    return tiny_llava_onevision(seed=seed, image_size=MICRO_IMAGE_SIZE_PX, hidden_size=hidden_size,
                                num_layers=num_layers, head_dim=head_dim)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (a weights file is about 1 MB: read whole)."""
    from hermes.tiers.files import sha256

    return sha256(Path(path).read_bytes())


def save_micro(model, tokenizer, path: str | Path, training: dict | None = None) -> str:
    """Write weights, config and tokenizer into one safetensors file; returns its sha256 (for
    `WEIGHTS_SHA256`).

    Args:
        path: output file (parent folders are created).
        training: what produced the weights (command, seed, steps, final loss), stored as JSON.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
    metadata = {
        META_CONFIG: model.config.to_json_string(use_diff=False),
        META_TOKENIZER: tokenizer.backend_tokenizer.to_str(),
        # transformers 5 calls them extra special tokens; the tokenizer JSON holds them too, this keeps their role
        META_SPECIAL_TOKENS: json.dumps([str(t) for t in getattr(tokenizer, "extra_special_tokens", [])]),
        META_TRAINING: json.dumps(training or {}, sort_keys=True),
    }
    save_file(state, str(path), metadata=metadata)
    path.chmod(0o644)  # shipped with the package: readable by everyone
    return file_sha256(path)


def read_training_info(path: str | Path = WEIGHTS_FILE) -> dict:
    """The training record stored in a weights file's header (command, seed, steps, losses)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return json.loads((fh.metadata() or {}).get(META_TRAINING, "{}"))


def load_micro(seed: int = 0, path: str | Path | None = None, sha256: str | None = None):
    """The trained micro model and its tokenizer, from the shipped (or a given) weights file.

    Args:
        seed: ignored (the weights are trained); accepted so every builder is called `build(seed=...)`.
        path: weights file; default the shipped `WEIGHTS_FILE`.
        sha256: expected checksum; default `WEIGHTS_SHA256` for the shipped file, none for another.

    Returns:
        (model, tokenizer), fp32 eval mode on the CPU.

    Raises:
        ModelError: the file is missing, its checksum differs, or it is not a micro weights file.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, PreTrainedTokenizerFast

    del seed
    shipped = path is None
    path = Path(WEIGHTS_FILE if shipped else path)
    if not path.is_file():
        raise ModelError(f"micro model weights not found at {path}; train them with "
                         f"`python scripts/train_micro.py --out {path}` or reinstall hermes-video")
    expected = sha256 if sha256 is not None else (WEIGHTS_SHA256 if shipped else None)
    if expected is not None:
        actual = file_sha256(path)
        if actual != expected:
            raise ModelError(f"micro model weights {path} have sha256 {actual[:16]}..., expected {expected[:16]}...: "
                             f"the file is corrupt or was replaced; reinstall hermes-video or retrain it")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if META_CONFIG not in meta or META_TOKENIZER not in meta:
        raise ModelError(f"{path} is a safetensors file but not micro model weights (no config/tokenizer in its header)")
    config = LlavaOnevisionConfig.from_dict(json.loads(meta[META_CONFIG]))
    model = LlavaOnevisionForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    if missing or unexpected:
        raise ModelError(f"{path} does not match the micro architecture: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(meta[META_TOKENIZER]), eos_token="<|im_end|>",
        pad_token="<|endoftext|>", additional_special_tokens=json.loads(meta.get(META_SPECIAL_TOKENS, "[]")))
    return model.eval(), tokenizer
