"""What the benchmark ran on: GPU, driver, CUDA, library versions, commit, date."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def _cmd(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=REPO)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: report as absent
        return None


def collect_env(device: torch.device) -> dict:
    cuda = device.type == "cuda"
    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
    except Exception:
        providers = []
    driver = _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None
    commit = os.environ.get("ARRCOC_COMMIT") or _cmd(["git", "rev-parse", "HEAD"])
    dirty = _cmd(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "gpu_memory_gb": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        if cuda
        else None,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "providers": providers,
        "python": platform.python_version(),
        "commit": commit,
        "commit_dirty": bool(dirty),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": str(device),
    }
