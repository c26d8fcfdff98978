"""The emulator: an OpenAI-compatible serving engine whose model compute is emulated.

    python -m pipeline.emulator --host 127.0.0.1 --port PORT --model NAME [--config FILE.yaml] [--<field> VALUE ...]

Files, one concern each:
    config.py        EmulatorConfig (pydantic, every field a flag), model presets from configs/models/
    tokens.py        prompt token counting and one-vocab-word-per-token output text
    prefix_cache.py  chained block hashes, LRU capacity in tokens
    timing.py        the arm (VATTN / VATTN_PLAN env), attention backends (cost model | kernel), StepTimer
    engine.py        continuous batching, chunked prefill, speculative-decoding cycles, deadline sleeps
    protocol.py      OpenAI request parsing and 4xx errors
    server.py        aiohttp routes: /v1/chat/completions, /v1/completions, /v1/models, /health,
                     /server_info, /metrics (sglang names)
    metrics.py       Prometheus text
    cyclelog.py      one JSON line per cycle, one file per server lifetime (--cycle-log-dir; --cycle-log FILE)
"""
