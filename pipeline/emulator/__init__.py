"""The emulator: an OpenAI-compatible serving engine whose model compute is emulated.

    python -m pipeline.emulator --host 127.0.0.1 --port PORT --model NAME [--config FILE.yaml] [--<field> VALUE ...]

Its config and command line (one flag per field, the model presets in configs/models/) are
pipeline/config/emulator.py's. Files, one concern each:
    tokens.py        prompt token counting and one-vocab-word-per-token output text
    prefix_cache.py  chained block hashes, LRU capacity in tokens
    arm.py           the arm, from the kernel switch in the env (VATTN / VATTN_PLAN, vattn/switch.py)
    attention.py     the attention models' protocol and the factory: cost model | kernel
    cost_attention.py  vattn's cost model on a hardware profile (any CPU)
    kernel_attention.py  the real vattn kernel timed on a GPU (kernel in the loop)
    timing.py        StepTimer: one cycle's time = non-attention + attention of the batch
    engine.py        continuous batching, chunked prefill, speculative-decoding cycles, deadline sleeps
    protocol.py      OpenAI request parsing and 4xx errors
    server.py        aiohttp routes: /v1/chat/completions, /v1/completions, /v1/models, /health,
                     /server_info, /metrics (sglang names)
    metrics.py       Prometheus text
    cyclelog.py      one JSON line per cycle, one file per server lifetime (--cycle-log-dir; --cycle-log FILE)
"""
