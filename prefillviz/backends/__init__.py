"""The speed lab: the measured backend, the engine's ``Backend`` protocol (``engine/backend.py``) with
the fastest kernels this machine ran.

    measured.py         MeasuredBackend: per step, the measured choice of attention and linears, and the C++ ops
    dispatch.py         the candidates, the step buckets, a table's choice; dispatch_tables.py keeps tables
    dispatch_tuning.py  checks every candidate against its oracle here, times the rest on the model's shapes
    attention.py        the attention candidates by name; linear_checks.py the linears' groups and oracle
    llama_weights.py    a model's linears packed per implementation (packed_weights.py: oneDNN, torch's packed op)
    host_memory.py      the allocator policy and huge pages; kv_spares.py the KV cache memory kept between engines
    labels.py           captions: which forward and which backend's ops ran
    ops/                the C++ ops and their build, oneDNN's matmul, the plain-torch attention versions

docs/BACKENDS.md tells what each buys, measured.
"""
