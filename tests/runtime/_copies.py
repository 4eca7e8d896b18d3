"""Helpers shared by the copy tests of TorchRuntime (paced copies, copies on SMs)."""
from __future__ import annotations

import pytest
import torch

#: a test that needs a CUDA GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run_completion(done) -> None:
    """Await a TorchRuntime completion synchronously (it never yields; a yield fails the test)."""
    for _ in done.__await__():
        raise AssertionError("a TorchRuntime completion yielded")
