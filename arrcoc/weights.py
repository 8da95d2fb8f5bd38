"""Weights files: safetensors with metadata naming the variant, the architecture and a version.

Loading refuses a file made for another variant or architecture, or one whose tensors do not
match the model, with a message saying which file to use instead.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .errors import WeightsError

FORMAT = "arrcoc-weights/1"


def architecture_hash(model: nn.Module) -> str:
    """Short hash of parameter names and shapes: changes whenever the architecture does."""
    spec = ";".join(f"{k}:{tuple(v.shape)}" for k, v in sorted(model.state_dict().items()))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors_sha256(state: dict[str, Tensor]) -> str:
    """Hash of every tensor's name, dtype, shape and bytes: catches a tampered or damaged file."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().contiguous().cpu()
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_weights(
    model: nn.Module, path: Path, variant: str, version: str, extra: dict[str, str] | None = None
) -> None:
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    meta = {
        "format": FORMAT,
        "variant": variant,
        "version": version,
        "architecture": architecture_hash(model),
        "tensors_sha256": tensors_sha256(state),
    }
    meta.update(extra or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata=meta)


def read_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file ({e}).") from e


def load_weights(model: nn.Module, path: Path, variant: str, expected_sha256: str | None = None) -> str:
    """Load `path` into `model` after checking it belongs to it; return the weights version.

    expected_sha256: the whole file's hash (the bundled weights ship one beside them).
    """
    if not path.is_file():
        raise WeightsError(f"Weights file {path} does not exist. Run `arrcoc train` or pass --weights.")
    if expected_sha256 is not None and file_sha256(path) != expected_sha256.strip().lower():
        raise WeightsError(
            f"{path} does not match its recorded SHA-256 (damaged or modified)."
            " Reinstall arrcoc or retrain with `arrcoc train`."
        )
    meta = read_metadata(path)
    if meta.get("format") != FORMAT:
        raise WeightsError(f"{path} is not an ARR-COC weights file (format {meta.get('format')!r}).")
    if meta.get("variant") != variant:
        raise WeightsError(f"{path} holds weights for {meta.get('variant')!r}, not {variant!r}.")
    expected = architecture_hash(model)
    if meta.get("architecture") != expected:
        raise WeightsError(
            f"{path} was trained for another version of {variant} (architecture"
            f" {meta.get('architecture')}, this code expects {expected}). Retrain with `arrcoc train`."
        )
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file ({e}).") from e
    if "tensors_sha256" in meta and tensors_sha256(state) != meta["tensors_sha256"]:
        raise WeightsError(
            f"{path}: the tensors do not match the hash in its metadata (damaged or modified)."
        )
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise WeightsError(f"{path} does not fit {variant}: missing {missing}, unexpected {unexpected}.")
    return meta.get("version", "unknown")
