"""Strict GPU mode on a machine without a GPU: lesson 01 fails, naming the first GPU section and the missing GPU."""

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from scripts import nbcheck


@pytest.mark.skipif(torch.cuda.is_available(), reason="strict mode passes on a GPU machine")
def test_lesson_01_fails_in_strict_mode_without_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_STRICT_GPU", "1")
    monkeypatch.setenv("COURSE_SMOKE", "1")
    nb = nbformat.read(nbcheck.ROOT / "notebooks" / "01_measuring.ipynb", as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name=nbcheck.KERNEL_NAME, resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    text = str(info.value)
    assert "GPURequiredError" in text and "strict GPU mode" in text
    assert "01.gpu-sync" in text and "no CUDA GPU" in text
