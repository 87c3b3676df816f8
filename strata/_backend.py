"""Pick the Triton backend before triton is imported.

Without a CUDA device, Triton kernels run through the interpreter (TRITON_INTERPRET=1): the same
kernel code, executed on the CPU with numpy. An explicit TRITON_INTERPRET in the environment wins.
"""
import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return torch.cuda.is_available()


if "TRITON_INTERPRET" not in os.environ and not _has_cuda():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
