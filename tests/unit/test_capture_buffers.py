"""The inspect capture's buffers (instrument/capture_buffers.py): what goes in comes out, in order, past their first
size."""

import numpy as np
import torch

from prefillviz.instrument.capture_buffers import Rows, StepNorms


def test_rows_keep_every_chunk_in_order_and_grow_past_their_capacity():
    rows, chunks = Rows(num_layers=3, capacity=8), {layer: [] for layer in range(3)}
    generator = torch.Generator().manual_seed(0)
    for size in (5, 1, 1, 4):  # a prefill chunk, two decodes, then more than the capacity of 8 allows (a recompute)
        for layer in range(3):
            chunk = torch.randn(2, size, 4, generator=generator)
            chunks[layer].append(chunk)
            rows.keep(layer, chunk.transpose(0, 1).contiguous().transpose(0, 1))  # a strided view, as the forward's q
    arrays = rows.arrays([0, 1, 2])
    for layer, array in enumerate(arrays):
        assert array.flags["C_CONTIGUOUS"] and array.shape == (2, 11, 4)
        np.testing.assert_array_equal(array, torch.cat(chunks[layer], dim=1).numpy())  # copies: exact
    assert rows.buffer.shape[2] >= 11


def test_rows_of_a_full_buffer_are_views_and_bf16_comes_back_as_fp32():
    rows = Rows(num_layers=1, capacity=6)
    chunk = torch.randn(3, 6, 2).to(torch.bfloat16)
    rows.keep(0, chunk)
    (array,) = rows.arrays([0])
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, chunk.float().numpy())


def test_step_norms_keep_the_calls_order_and_more_calls_than_layers():
    norms = StepNorms(num_layers=2, num_kv_heads=3, tokens=4)
    written = []
    for call, layer in enumerate((0, 1, 1)):  # a third call: past the buffer's two layers
        key, value = torch.full((3, 4), float(call)), torch.full((3, 4), float(10 + call))
        norms.keep_kv(layer, key, value)
        written.append((key, value))
    assert norms.layers == [0, 1, 1]
    # (calls, T, KVH)
    np.testing.assert_array_equal(norms.kv_array(norms.keys), torch.stack([k.T for k, _ in written]).numpy())
    np.testing.assert_array_equal(norms.kv_array(norms.values), torch.stack([v.T for _, v in written]).numpy())
    norms.keep_hidden(2, torch.full((4,), 2.0))
    norms.keep_hidden(0, torch.zeros(4))
    # index order, only those seen
    np.testing.assert_array_equal(norms.hidden_array(), np.array([[0.0] * 4, [2.0] * 4], dtype=np.float32))
