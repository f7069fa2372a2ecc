"""Disaggregated prefill: a prefill worker and a decode worker, and each request's KV cache sent
between them (DistServe, OSDI'24; vLLM's and NVIDIA Dynamo's prefill/decode split).

    spec.py         what the workers are told and send back; placement (gloo / NCCL), timeouts
    kv_transfer.py  a request's K/V out of one paged cache, over torch.distributed, into another
    workers.py      the two processes: whole-prompt prefill + first token, then decode
    launch.py       spawn both, wait with a deadline, stop both in ``finally``
    experiment.py   the Chunked prefill page's workload on one engine (chunking off, on) and disaggregated
"""
