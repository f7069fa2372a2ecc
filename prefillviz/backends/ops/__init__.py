"""The measured backend's kernels: the C++ CPU ops (``engine_ops.py``, ``csrc/``), linears on oneDNN's
matmul primitive (``onednn_linear.py``) and on the engine's brgemm and slab linears
(``brgemm_linear.py``), the paged attention versions the dispatch chooses from (``paged.py``,
checked against their oracle by ``paged_check.py``). The teaching family lives in ``prefillviz/kernels/``."""
