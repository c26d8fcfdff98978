"""Dummy weights whose answers depend on the prompt: `--vattn-dummy-init scaled`.

sglang's `--load-format dummy` fills every floating parameter, norm weights included, from
uniform(-1e-3, 1e-3), with one seed for every parameter (so all layers of a shape get the same values).
Activations then shrink by ~1e-3 at each projection, attention adds almost nothing to the residual
stream, and the model answers every prompt alike: on an H200 with sglang 0.5.17, 16 different prompts
gave one output and one logprob (-8.3177) per token, in both arms and whatever the kernel
(benchmarks/e2e/h200-sglang-smoke/smoke-lossy-sglang-init.json). Such a model serves the load's shapes well enough for timing, but
greedy-output identity and logprob drift between arms can then show no kernel change at all.

`scaled` initialises like a trained network's starting point instead: each matrix (and embedding) from
N(0, 1/fan_in) so activations keep their scale through the layers, norm weights at 1, biases at 0, each
parameter from its own seed (its name's), deterministic across launches. Attention then moves the answer,
and a kernel that changes attention's output changes logprobs. Answers are still gibberish: this is for
comparing arms, never for accuracy. Under tensor parallelism each rank draws its own shard from the
name's seed (a consistent random model per TP size, not across TP sizes).

The launcher (vattn.sglang.launch) strips the flag and exports it as VATTN_DUMMY_INIT; sglang's scheduler
processes (spawned, so they re-import the launcher) install the patch from that env at import.
"""
from __future__ import annotations

import os
import zlib

FLAG = "--vattn-dummy-init"
ENV = "VATTN_DUMMY_INIT"
MODES = ("sglang", "scaled")


def check(value: str, where: str = FLAG) -> str:
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{where}: got {value!r}; allowed: {', '.join(MODES)} (sglang: its own "
                         f"uniform(-1e-3, 1e-3); scaled: prompt-dependent answers, see vattn.sglang.dummy_init)")
    return mode


def from_env() -> str:
    value = os.environ.get(ENV, "").strip()
    return check(value, ENV) if value else "sglang"


def scaled_init(model, low: float = -1e-3, high: float = 1e-3, seed: int = 1234) -> None:
    """sglang's initialize_dummy_weights signature (low and high unused): see the module docstring."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if not torch.is_floating_point(param):
                continue
            if param.dim() < 2:
                gain = not name.endswith("bias") and ("norm" in name or name.endswith("scale"))
                param.fill_(1.0 if gain else 0.0)
                continue
            gen = torch.Generator(device=param.device)
            gen.manual_seed(seed + zlib.crc32(name.encode()))
            fan_in = param.shape[-1]
            values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            values.normal_(0.0, fan_in ** -0.5, generator=gen)
            param.copy_(values.to(param.dtype))


def install() -> bool:
    """Replace sglang's dummy initialisation in this process when VATTN_DUMMY_INIT=scaled; True if it did."""
    if from_env() != "scaled":
        return False
    from sglang.srt.model_loader import loader

    loader.initialize_dummy_weights = scaled_init
    return True
