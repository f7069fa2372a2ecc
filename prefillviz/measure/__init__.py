"""Every benchmark, in one place: ``bench`` (its keys declared in ``bench_keys.toml``), its
fresh-process and peer parts, the machine's peaks and their history, the dtype speed, the
Kernel timings page's runs and the kernel benchmark, the roofline points and the GPU check."""
