"""The two worker processes: each its own ``LLMEngine``, paged KV cache and copy of the model.

    prefill worker (rank 0)                         decode worker (rank 1)
    whole-prompt steps, samples the first token     decode-first steps, one token per request
    gather K/V through its block table  --header-->  receiver thread: header, then payload
                                        --payload->  main loop: allocate blocks, write, decode
    waits for the long prompt's arrival  <--event--  sets it once the short requests have
                                                     ``arrival_step`` tokens each

Both join one ``torch.distributed`` group (gloo on a CPU, NCCL with a GPU each). The arrival
event is the workload's client, not part of serving. Each worker catches its own failure,
sends its message to the parent and exits; the parent stops the other one.
"""

from __future__ import annotations

import datetime
import os
import queue
import signal
import threading
import time

import torch
import torch.distributed as dist

from prefillviz.disagg.kv_transfer import (
    KVHeader,
    TransferRecord,
    gather_request_kv,
    payload_bytes,
    payload_digest,
    payload_shape,
    receive_header,
    receive_payload,
    send_request_kv,
    write_request_kv,
)
from prefillviz.disagg.spec import (
    DECODE_RANK,
    PREFILL_RANK,
    ROLES,
    DisaggError,
    DisaggSpec,
    WorkerFailure,
    WorkerResult,
)
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.warm_up import short_warm_up


def worker_main(rank: int, spec: DisaggSpec, results, arrival) -> None:
    """The entry point of both processes (``torch.multiprocessing.start_processes`` passes ``rank``)."""
    role = ROLES[rank]
    try:
        results.put(_run_worker(rank, spec, arrival))
    except Exception as error:  # the parent shows this and stops the other worker
        message = str(error) if isinstance(error, DisaggError) else f"{type(error).__name__}: {error}"
        results.put(WorkerFailure(role, message))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_worker(rank: int, spec: DisaggSpec, arrival) -> WorkerResult:
    torch.set_num_threads(spec.num_threads)  # the workers split the cores between them
    start = time.perf_counter()
    timeout = datetime.timedelta(seconds=spec.timeouts.start_s)
    dist.init_process_group(
        spec.placement.backend, init_method=f"tcp://127.0.0.1:{spec.port}", rank=rank, world_size=2, timeout=timeout
    )
    device = torch.device(spec.placement.devices[rank])
    model = spec.load(str(device))
    short_warm_up(model)
    load_s = time.perf_counter() - start
    if spec.placement.backend == "gloo":
        dist.monitored_barrier(timeout=timeout)  # names the rank that did not arrive
    else:
        dist.barrier()
    ready = time.perf_counter()
    wire_device = device if spec.placement.backend == "nccl" else torch.device("cpu")
    loop = _prefill_loop if rank == PREFILL_RANK else _decode_loop
    engine, transfers, payloads = loop(model, spec, arrival, wire_device)
    for transfer in transfers:  # off the clock: after every timed step
        digest = payload_digest(payloads[transfer.request_id])
        setattr(transfer, "sent_sha256" if rank == PREFILL_RANK else "received_sha256", digest)
    return WorkerResult(
        role=ROLES[rank],
        trace=engine.trace(),
        engine_start_time=engine.start_time,
        ready_time=ready,
        load_s=load_s,
        num_threads=torch.get_num_threads(),
        transfers=transfers,
        payloads={rid: payload_bytes(p) for rid, p in payloads.items()} if spec.keep_payloads else {},
    )


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _prefill_loop(model, spec: DisaggSpec, arrival, wire_device: torch.device):
    """Prefill whole prompts, sample each first token, ship the K/V and let the request go."""
    work = spec.workload
    engine = LLMEngine(model, None, work.engine_config(enable_chunked_prefill=False))
    long_index = len(work.short_prompts)
    requests = {}

    def add(index: int) -> None:  # 2 tokens asked, so the request is still running (blocks held) after the first
        request_id = spec.request_ids[index]
        requests[request_id] = (
            index, engine.add_request(list(spec.prompts[index]), SamplingParams(max_new_tokens=2), request_id)
        )

    for index in range(long_index + (work.arrival_step == 0)):
        add(index)
    transfers, payloads = [], {}
    while len(transfers) < len(spec.request_ids):
        if spec.request_ids[long_index] not in requests and arrival.is_set():
            add(long_index)
        if not engine.has_unfinished_requests():
            if not arrival.wait(timeout=spec.timeouts.idle_s):
                raise DisaggError(
                    f"The decode worker did not signal the long prompt's arrival within {spec.timeouts.idle_s:g} s."
                )
            continue
        record = engine.step()
        for request_id in record.sampled_token_ids:
            index, request = requests[request_id]
            payload = gather_request_kv(engine.kv_cache, request.block_table, request.num_prompt_tokens)
            header = KVHeader(
                index, request.num_prompt_tokens, request.output_token_ids[0], request.arrival_time,
                request.first_token_time, time.perf_counter(),
            )
            before_payload = {
                "prefill_killed_mid_transfer": _kill_self,
                "transfer_stalls": lambda: time.sleep(10 * spec.timeouts.run_s),
            }.get(spec.fault)
            sent = send_request_kv(header, payload, DECODE_RANK, wire_device, spec.timeouts.transfer_s, before_payload)
            transfers.append(TransferRecord(
                request_id, header.num_tokens, payload.nelement() * payload.element_size(), header.send_start_time, sent
            ))
            payloads[request_id] = payload
            engine.abort_request(request_id)  # handed off: its blocks are free for the next prompt
    return engine, transfers, payloads


def _receive_all(spec: DisaggSpec, engine: LLMEngine, wire_device: torch.device, inbox: queue.Queue) -> None:
    """The decode worker's receiver thread: every request's header, then its payload (the waits release the GIL)."""
    try:
        for _ in spec.request_ids:
            header = receive_header(PREFILL_RANK, wire_device, spec.timeouts.idle_s)
            if spec.fault == "decode_killed_mid_transfer":
                _kill_self()
            shape = payload_shape(engine.kv_cache, header.num_tokens)
            payload = receive_payload(shape, engine.dtype, PREFILL_RANK, wire_device, spec.timeouts.transfer_s)
            inbox.put((header, payload, time.perf_counter()))
    except Exception as error:
        inbox.put(error)


def _decode_loop(model, spec: DisaggSpec, arrival, wire_device: torch.device):
    """Admit each received request into blocks of its own and decode every running request each step."""
    work = spec.workload
    engine = LLMEngine(model, None, work.engine_config(enable_chunked_prefill=True))
    inbox: queue.Queue = queue.Queue()
    receiver = threading.Thread(
        target=_receive_all, args=(spec, engine, wire_device, inbox), name="kv-receiver", daemon=True
    )
    receiver.start()
    short_ids = spec.request_ids[: len(work.short_prompts)]
    admitted, transfers, payloads = {}, [], {}
    while len(admitted) < len(spec.request_ids) or engine.has_unfinished_requests():
        items = []
        if not engine.has_unfinished_requests():  # nothing to decode: wait for the next request
            try:
                items.append(inbox.get(timeout=spec.timeouts.idle_s + spec.timeouts.transfer_s))
            except queue.Empty:
                raise DisaggError("The decode worker's receiver went quiet without an error.") from None
        while True:
            try:
                items.append(inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if isinstance(item, Exception):
                raise DisaggError(f"The decode worker lost the KV stream: {item}") from item
            header, payload, received = item
            request_id = spec.request_ids[header.request_index]
            params = SamplingParams(max_new_tokens=spec.max_new_tokens(header.request_index))
            prompt = list(spec.prompts[header.request_index])
            request = engine.add_prefilled_request(
                prompt, header.first_token_id, params, request_id, header.arrival_time, header.first_token_time
            )
            write_request_kv(engine.kv_cache, request.block_table, payload)
            num_bytes = payload.nelement() * payload.element_size()
            transfers.append(TransferRecord(
                request_id, header.num_tokens, num_bytes, header.send_start_time, None, received, time.perf_counter()
            ))
            admitted[request_id], payloads[request_id] = request, payload
        if not arrival.is_set() and all(
            rid in admitted and (len(admitted[rid].output_token_ids) >= work.arrival_step or admitted[rid].is_finished)
            for rid in short_ids
        ):
            arrival.set()  # the long prompt "arrives" at the prefill worker now
        if engine.has_unfinished_requests():
            engine.step()
    return engine, transfers, payloads
