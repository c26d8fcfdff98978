"""Which sglang attention backend the `vattn` backend wraps (its "base").

The base serves every call vattn does not, so it decides what the `VATTN=0` arm measures: it
must be the backend users run in production on that GPU, not a convenient one. Two sources:
- `--vattn-base fa3|flashinfer|triton` on `python -m vattn.sglang.launch`. The launcher strips
  the flag before sglang parses its arguments and exports it as `VATTN_BASE` (vattn.sglang.options),
  which sglang's scheduler processes (started with spawn) inherit; the backend reads it there.
- otherwise sglang's own default for this model on this GPU (the function sglang calls when
  `--attention-backend` is absent), so the base is what sglang would have picked: FA3 for MHA on
  Hopper without speculation or with topk 1 at page size 1 (sglang's is_no_spec_infer_or_topk_one
  wants page 1 with topk 1, so topk 1 at page 16 gets FlashInfer), FlashInfer or Triton elsewhere.
Pure Python at import; `default_base` imports sglang.
"""
from __future__ import annotations

import os

BASES = ("fa3", "flashinfer", "triton")
FLAG = "--vattn-base"
ENV = "VATTN_BASE"


def check(value: str, where: str = FLAG) -> str:
    """A base name as given by the user -> the name, or ValueError naming what is allowed."""
    name = value.strip().lower()
    if name not in BASES:
        raise ValueError(f"{where}: got {value!r}; allowed: {', '.join(BASES)} "
                         f"(or leave it out for sglang's own default on this GPU)")
    return name


def from_env() -> str | None:
    """The base the launcher exported, or None (then sglang's default applies)."""
    value = os.environ.get(ENV, "").strip()
    return check(value, ENV) if value else None


def default_base(runner) -> str:
    """What sglang itself would pick for `--attention-backend` on this model and GPU.

    sglang 0.5.17 keeps the rule as a ServerArgs method; 0.5.23 moved it to a function of the
    resolving view (arg_groups.model_override_base). Both take (args, use_mla, model_config)."""
    args = runner.server_args
    try:
        from sglang.srt.arg_groups.model_override_base import get_default_attn_backend
    except ImportError:  # sglang 0.5.17
        return args._get_default_attn_backend(bool(runner.use_mla_backend), runner.model_config)
    return get_default_attn_backend(args, bool(runner.use_mla_backend), runner.model_config)


def resolve(runner) -> tuple[str, str]:
    """(base name, where it came from) for this runner: VATTN_BASE, else sglang's default."""
    chosen = from_env()
    if chosen is not None:
        return chosen, ENV
    return default_base(runner), "sglang default"
