"""The host allocator's settings (prefillviz/backends/host_memory.py): applied once, said in words, switchable off."""

import subprocess
import sys

import pytest

from prefillviz.backends import host_memory

SCRIPT = ("from prefillviz.backends import host_memory as h; print(h.status() == ''); "
          "print(h.keep_freed_memory()); print(h.keep_freed_memory() is h.status())")


def run(env_value: str | None) -> list[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != host_memory.STOCK_ENV}
    if env_value is not None:
        env[host_memory.STOCK_ENV] = env_value
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env,
                            check=True)
    return result.stdout.splitlines()


def test_set_once_per_process_and_says_what_it_did():
    before, said, same = run(None)
    assert before == "True" and same == "True"
    if sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver()):
        assert said.startswith("glibc ") and "keeps freed memory" in said
    else:
        assert said.startswith("the C library's default malloc")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_switch_leaves_the_defaults(value):
    assert run(value)[1] == f"the C library's default malloc ({host_memory.STOCK_ENV} is set)"


def test_huge_page_tensors_are_aligned_writable_and_plain_when_small_or_switched_off(monkeypatch):
    import mmap

    import torch

    monkeypatch.delenv(host_memory.NO_HUGE_PAGES_ENV, raising=False)
    shape = (3, host_memory.HUGE_PAGE_BYTES // 4 + 5)  # fp32: three huge pages' worth and a little more
    tensor, advised = host_memory.huge_page_empty(shape, torch.float32)
    assert tensor.shape == shape and tensor.dtype == torch.float32 and tensor.is_contiguous()
    assert advised == hasattr(mmap, "MADV_HUGEPAGE")
    if advised:
        assert tensor.data_ptr() % host_memory.HUGE_PAGE_BYTES == 0
    values = torch.arange(tensor.numel(), dtype=torch.float32).view(shape)
    tensor.copy_(values)
    del values
    assert torch.equal(tensor.flatten()[-3:], torch.arange(tensor.numel() - 3, tensor.numel(), dtype=torch.float32))
    small, small_advised = host_memory.huge_page_empty((16, 16), torch.bfloat16)
    assert small.shape == (16, 16) and small.dtype == torch.bfloat16 and not small_advised
    monkeypatch.setenv(host_memory.NO_HUGE_PAGES_ENV, "1")
    assert host_memory.huge_page_empty(shape, torch.float32)[1] is False
