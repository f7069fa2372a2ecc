"""The engine's production ops: the C++ CPU ops (``engine_ops.py``, ``csrc/``) and their
plain-torch twins (``torch_ops.py``), linears on oneDNN's matmul primitive (``onednn_linear.py``),
and the paged attention versions the measured dispatch chooses from (``paged.py``, checked
against their oracle by ``paged_check.py``). The teaching family lives in ``prefillviz/kernels/``."""
