"""Real engines run beside ours on the same workload (vLLM), each in a process of its own."""
