"""The streaming prefill engine: expert cache + loan + ring, copies overlapped with compute.

    host.py      HostExperts: every expert blob in host memory, pinned when possible
    device.py    Lane: the compute/copy streams and events of one device (no-ops on the CPU)
    provider.py  StreamingProvider: a layer's experts from cache slots and ring slots, in batches
    prefill.py   PrefillEngine: plan, borrow, carve, read the prompt chunk by chunk, refill
    stats.py     PrefillStats: what a prompt cost (bytes streamed, H2D rate, waits, cache hits)
"""
