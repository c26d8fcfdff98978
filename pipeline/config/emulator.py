"""The emulator's configuration: one pydantic model; a YAML file and command-line flags both set it.

Precedence, lowest first: the field defaults, the model preset (configs/models/<model_preset>.yaml,
which sets the model-shape fields), the --config YAML file, then the flags (make_parser: one flag per
field). The arm (VATTN, VATTN_PLAN) is not a field: it comes from the environment, as for every engine
(vattn/switch.py). A recipe's server.args are read here too (check_server_args), so a bad flag fails
`pipeline validate`, not the server stage.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.paths import HARDWARE_PROFILES_DIR, MODEL_PRESETS_DIR, configs_missing_hint, preset_file
from vattn.contract import HEAD_DIMS, PAGE_SIZES
from vattn.planner import DEFAULT_PLANNER, PLANNERS

DEFAULT_PRESET = "qwen3.5-397b-a17b-tp2"
# Fields a model preset may set (the model's shape and its speculative head); a preset file with
# anything else is refused, so presets cannot quietly change serving policy.
SHAPE_FIELDS = ("tp_size", "attention_layers", "draft_attention_layers", "num_kv_heads", "head_dim", "gqa",
                "kv_dtype", "page_size", "max_context_tokens", "draft_tokens", "accept_probs")


class ConfigError(ValueError):
    """A configuration error with a message fit for the user (names the field, the value, the rule)."""


class EmulatorConfig(BaseModel):
    """Everything the emulator needs; see pipeline/emulator/__init__.py for the engine model."""

    # A nan or inf flag is named as not finite, not by whichever bound it happens to fail.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # -- server --
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(30000, ge=1, le=65535, description="TCP port to listen on.")
    model: str = Field("emulated-model", min_length=1,
                       description="Served model name: requests must name it; /v1/models lists it.")
    tokenizer: str | None = Field(None, description=(
        "HF tokenizer directory (tokenizer.json) used to count prompt tokens and to make output text, one "
        "vocab word per generated token. Unset: whitespace-separated words count as tokens."))
    cycle_log: str | None = Field(None, description=(
        "Write one JSON line per engine cycle to this file (created new: an existing file is an error)."))
    cycle_log_dir: str | None = Field(None, description=(
        "Write the cycle log to <dir>/lifetime-<n>.jsonl, n the lowest free number: one file per server start."))
    cycle_log_flush_s: float = Field(1.0, gt=0, le=60, description="Flush the cycle log at least this often.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Server log level.")

    # -- scheduler --
    max_running_requests: int = Field(64, ge=1, le=4096, description=(
        "Most requests in the running batch; the rest wait in a FIFO queue."))
    chunked_prefill_size: int = Field(8192, ge=16, le=1_048_576, description=(
        "Most prompt tokens prefilled per cycle, over all prefilling requests (chunked prefill)."))
    max_context_tokens: int = Field(262_144, ge=64, le=4_194_304, description=(
        "Context window: longer prompts get a 400; generation stops (finish_reason length) at it."))
    max_total_tokens: int = Field(0, ge=0, le=10**10, description=(
        "KV-pool capacity in tokens: a waiting request is admitted only while the running requests' "
        "contexts plus its prompt fit (FIFO, head of line blocks; a lone request is always admitted); "
        "no preemption. 0 = unlimited."))
    disable_prefix_cache: bool = Field(False, description="Turn the prefix cache off (every prompt is prefilled).")
    prefix_block_tokens: int = Field(16, ge=1, le=4096, description=(
        "Prefix-cache block size in tokens: prompts hit the cache in whole blocks."))
    prefix_cache_tokens: int = Field(8_000_000, ge=0, le=10**10, description=(
        "Prefix-cache capacity in tokens (least recently used blocks are evicted)."))
    default_max_tokens: int = Field(1024, ge=1, le=1_048_576, description=(
        "Output tokens of a request that sets no max_tokens (and no max_completion_tokens)."))
    eos_after_tokens: int = Field(0, ge=0, le=1_048_576, description=(
        "A request without ignore_eos stops (finish_reason stop) after this many tokens, standing in for "
        "the model's EOS; 0 = only max_tokens ends a request."))
    seed: int = Field(0, ge=0, description="Seed of the acceptance sampler and of the output words.")

    # -- speculative decoding (MTP / EAGLE) --
    draft_tokens: int = Field(3, ge=0, le=8, description=(
        "Draft tokens per cycle; each decode sequence verifies draft_tokens + 1 query tokens and emits "
        "1 .. draft_tokens + 1 tokens. 0 = plain decode (one token per cycle)."))
    accept_probs: list[float] = Field([0.8, 0.6, 0.45], description=(
        "Per-position acceptance: draft token i is accepted with probability accept_probs[i] given that "
        "tokens 0..i-1 were; one value per draft token."))

    # -- model shape (preset: configs/models/*.yaml) --
    model_preset: str = Field(DEFAULT_PRESET, description=(
        "Model-shape preset: a name in configs/models/ or a YAML path. It sets the shape fields below; "
        "explicit fields override it."))
    tp_size: int = Field(1, ge=1, le=64, description=(
        "GPUs the emulated server stands for (tensor parallelism; the per-GPU fields below are after it). "
        "The time model does not read it: a sweep divides output throughput by it into per-GPU figures."))
    attention_layers: int = Field(15, ge=1, le=1024, description="Full-attention layers of the target model.")
    draft_attention_layers: int = Field(1, ge=0, le=64, description=(
        "Attention layers of the draft (MTP) model; each runs one extend plus draft_tokens-1 decode calls."))
    num_kv_heads: int = Field(1, ge=1, le=256, description="KV heads per GPU (after tensor parallelism).")
    head_dim: int = Field(256, description="Head dimension (64, 128 or 256).")
    gqa: int = Field(16, ge=1, le=64, description="Query heads per KV head.")
    kv_dtype: Literal["fp8_e4m3", "bf16"] = Field("fp8_e4m3", description="KV-cache element type.")
    page_size: int = Field(16, description="KV-cache page size in tokens (1, 16 or 64).")

    # -- time model --
    attention: Literal["model", "kernel"] = Field("model", description=(
        "How attention time is obtained: 'model' = vattn's cost model on a hardware profile (any CPU); "
        "'kernel' = run the real vattn kernel on the batch (needs a CUDA GPU)."))
    kernel_pool_gib: float = Field(16.0, ge=0.25, le=1024, description=(
        "attention: kernel only: most GiB of device memory for the random K+V page pool (sized for "
        "max_running_requests full contexts, at least 1 GiB; pages are reused round-robin past it)."))
    hardware: str = Field("h200", min_length=1, description=(
        "Hardware profile for the cost model: a name in configs/hardware/ or a YAML path."))
    non_attn_base_us: float = Field(8000.0, ge=0, le=10**7, description=(
        "Modelled non-attention time of every cycle (weights, MoE, linear-attention layers), us."))
    non_attn_per_token_us: float = Field(25.0, ge=0, le=10**5, description=(
        "Modelled non-attention time per token processed in a cycle (prefill chunk tokens plus "
        "draft_tokens+1 per decode sequence), us."))
    prefill_attention_tflops: float = Field(400.0, gt=0, le=10**5, description=(
        "Effective TFLOP/s of prefill attention (causal FLOPs of each chunk over its prefix)."))
    time_scale: float = Field(1.0, gt=0, le=1000, description=(
        "Wall seconds slept per modelled second (1 = real time; 0.1 runs ten times faster)."))

    @field_validator("hardware")
    @classmethod
    def _named_profile(cls, name: str) -> str:
        # A name is looked up here; a path is read where the server runs (pipeline/emulator/cost_attention.py).
        if not Path(name).suffix and not preset_file(name, HARDWARE_PROFILES_DIR).is_file():
            known = ", ".join(sorted(p.stem for p in HARDWARE_PROFILES_DIR.glob("*.yaml")))
            raise ValueError(f"no profile named {name!r} in {HARDWARE_PROFILES_DIR}; known: {known}, "
                             f"or a path to a profile YAML")
        return name

    @model_validator(mode="before")
    @classmethod
    def _merge_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("model_preset", DEFAULT_PRESET)
        preset = load_preset(name)
        if "draft_tokens" in data and "accept_probs" not in data:
            source = (f"model preset {name}" if "accept_probs" in preset else "the default")
            probs = preset.get("accept_probs", cls.model_fields["accept_probs"].default)
            data = {**data, "accept_probs": _probs_for(data["draft_tokens"], probs, source)}
        return {**preset, **data}

    @model_validator(mode="after")
    def _check(self) -> "EmulatorConfig":
        if self.cycle_log and self.cycle_log_dir:
            raise ValueError("cycle_log and cycle_log_dir are both set; give one (cycle_log_dir: one file per "
                             "server start)")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: {self.head_dim} is not supported; allowed: {', '.join(map(str, HEAD_DIMS))}")
        if self.page_size not in PAGE_SIZES:
            raise ValueError(f"page_size: {self.page_size} is not supported; allowed: "
                             f"{', '.join(map(str, PAGE_SIZES))}")
        if len(self.accept_probs) != self.draft_tokens:
            raise ValueError(f"accept_probs: {len(self.accept_probs)} values {self.accept_probs} for "
                             f"draft_tokens={self.draft_tokens}; give exactly one probability per draft token")
        bad = [p for p in self.accept_probs if not 0.0 <= p <= 1.0]
        if bad:
            raise ValueError(f"accept_probs: {bad} outside [0, 1]")
        return self

    def mean_accept_length(self) -> float:
        """Expected tokens emitted per decode cycle: 1 + sum_i prod_{j<=i} p_j."""
        total, run = 1.0, 1.0
        for p in self.accept_probs:
            run *= p
            total += run
        return total


def _probs_for(draft_tokens: Any, probs: list[float], source: str) -> list[float]:
    """The acceptance probabilities to go with a draft_tokens set without them: none for plain decode (there is
    no draft token to accept), else `probs` if they fit; a count that does not fit is the user's to choose."""
    try:
        n = int(draft_tokens)
    except (TypeError, ValueError):
        return probs  # the field's own check names the value
    if n == 0 or n == len(probs):
        return [] if n == 0 else probs
    example = (list(probs) + [probs[-1] if probs else 0.5] * n)[:n]
    raise ValueError(f"accept_probs: {len(probs)} values {probs} for draft_tokens={n}; those come from {source}: "
                     f"set accept_probs beside draft_tokens, one probability per draft token, e.g. "
                     f"accept_probs: {example}")


def names_a_file(field: str, value: str) -> bool:
    """Whether a flag's value is a path on the server's machine: --config always; --model-preset with a .yaml or
    .yml suffix (load_preset's rule), --hardware with any suffix (_named_profile's); else a name in configs/."""
    if field == "model_preset":
        return Path(value).suffix in (".yaml", ".yml")
    return field == "config" or (field == "hardware" and Path(value).suffix != "")


def load_preset(name_or_path: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = preset_file(name_or_path, MODEL_PRESETS_DIR)
    if not path.is_file():
        known = sorted(p.stem for p in MODEL_PRESETS_DIR.glob("*.yaml"))
        raise ConfigError(f"model_preset: {name_or_path!r} not found (looked for {path}); known presets: {known}"
                          + configs_missing_hint())
    data = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(data) - set(SHAPE_FIELDS))
    if not isinstance(data, dict) or unknown:
        raise ConfigError(f"model_preset {path}: fields {unknown} are not model-shape fields; "
                          f"a preset may set only {list(SHAPE_FIELDS)}")
    return data


def format_validation_error(err: ValidationError, where: str = "emulator config") -> str:
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:  # a cross-field rule: its message already names the field
            lines.append(f"{where}: {msg}")
            continue
        field = ".".join(str(p) for p in e["loc"])
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        lines.append(f"{where}: {field}: {msg}{got}")
    return "\n".join(lines)


def build_config(data: dict[str, Any], where: str = "emulator config") -> EmulatorConfig:
    """Validate merged settings; raise ConfigError with one line per bad field, each led by `where`."""
    try:
        return EmulatorConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where)) from None


# -- the command line: `python -m pipeline.emulator`, and a recipe's server.args as the adapter passes them --

def _help(name: str, field) -> str:
    bounds = [f"{k} {getattr(m, k)}" for m in field.metadata for k in ("ge", "gt", "le", "lt")
              if getattr(m, k, None) is not None]
    if get_origin(field.annotation) is Literal:
        bounds.append("choices: " + " | ".join(map(str, get_args(field.annotation))))
    if name in SHAPE_FIELDS:
        bounds.append("set by model_preset")
    extra = f" [{', '.join(bounds)}]" if bounds else ""
    default = EmulatorConfig.model_fields[name].default
    return f"{field.description}{extra} (default: {default})".replace("%", "%%")


class _FlagParser(argparse.ArgumentParser):
    """argparse prints its usage and exits on a flag without its value; a recipe's server.args are read inside
    `pipeline validate`, where that was a 30-line dump naming no field. Raise instead: _flag_values adds where."""

    def error(self, message: str):
        message = message.removeprefix("argument ")
        for argparse_says, we_say in (("expected one argument", "expected a value"),
                                      ("expected at least one argument", "expected at least one value")):
            message = message.replace(argparse_says, we_say)
        raise ConfigError(message)


def make_parser() -> argparse.ArgumentParser:
    """One flag per field: `max_running_requests` is `--max-running-requests VALUE`; booleans are bare flags
    (`--disable-prefix-cache`); lists take several values or one comma-separated value."""
    parser = _FlagParser(
        prog="python -m pipeline.emulator",
        description="OpenAI-compatible serving emulator: continuous batching, chunked prefill, prefix cache, "
                    "speculative decoding; each cycle sleeps for modelled time (attention from vattn's cost "
                    "model). Arm from env (vattn/switch.py): VATTN=0 baseline kernel + fixed split; VATTN=1 or "
                    "unset vattn with VATTN_PLAN (one of "
                    f"{' | '.join(PLANNERS)}, default {DEFAULT_PLANNER}).")
    parser.add_argument("--config", metavar="FILE.yaml", help="YAML file of config fields (flags override it).")
    for name, field in EmulatorConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, nargs="?", const="true", default=None, metavar="true|false",
                                help=_help(name, field))
        elif name == "accept_probs":
            parser.add_argument(flag, dest=name, nargs="+", default=None, metavar="P", help=_help(name, field))
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=_help(name, field))
    return parser


def _flag_values(argv: list[str] | None, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config fields argv sets: (the --config file's, the flags'); unknown flags are a ConfigError."""
    try:
        args, unknown = make_parser().parse_known_args(argv)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if unknown:
        flags = [a for a in unknown if a.startswith("-")] or unknown
        raise ConfigError(f"{where}: unknown flag(s) {' '.join(flags)}; "
                          f"`python -m pipeline.emulator --help` lists every flag")
    values = vars(args)
    config_path = values.pop("config")
    file_data: dict[str, Any] = {}
    if config_path:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(f"{where}: --config: file {config_path!r} not found")
        try:
            file_data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{where}: --config {path}: not valid YAML ({' '.join(str(e).split())})") from None
        if not isinstance(file_data, dict):
            raise ConfigError(f"{where}: --config {path}: expected a mapping of config fields, "
                              f"got {type(file_data).__name__}")
    flags = {}
    for name, value in values.items():
        if value is None:
            continue
        if name == "accept_probs":
            value = [v for item in value for v in str(item).split(",") if v.strip()]
        flags[name] = value
    return file_data, flags


def config_from_argv(argv: list[str] | None = None) -> EmulatorConfig:
    file_data, flags = _flag_values(argv, "emulator config")
    return build_config({**file_data, **flags})


# Flags the engine adapter sets from the recipe and the run (pipeline/engines/emulator.py), never server.args.
ADAPTER_FLAGS = {"host": "the placement", "port": "server.port", "model": "model", "tokenizer": "tokenizer",
                 "cycle_log": "the run dir", "cycle_log_dir": "the run dir"}


def tp_size_source(argv: list[str]) -> tuple[int, str]:
    """The tp_size an emulator started with these flags runs at, and what sets it (a flag, the --config file,
    or the model preset: the GPUs of the server it stands for)."""
    file_data, flags = _flag_values(argv, "server.args")
    cfg = build_config({f: v for f, v in {**file_data, **flags}.items() if f not in ADAPTER_FLAGS}, "server.args")
    if "tp_size" in flags:
        return cfg.tp_size, f"--tp-size {cfg.tp_size}"
    if "tp_size" in file_data:
        return cfg.tp_size, "tp_size of the --config file"
    if "tp_size" in load_preset(cfg.model_preset):
        return cfg.tp_size, f"tp_size of model preset {cfg.model_preset}"
    return cfg.tp_size, f"model preset {cfg.model_preset} sets no tp_size"


def check_server_args(argv: list[str], where: str) -> None:
    """Read one arm's server.args (as the adapter's argv) as the emulator will; raise ConfigError naming
    each bad flag. A --config file or a model preset given as a path is read from this machine; a hardware
    profile given as a path is read by the server when it starts (pipeline/emulator/cost_attention.py)."""
    file_data, flags = _flag_values(argv, where)
    errors = [f"{where}: --{f.replace('_', '-')}: set from {ADAPTER_FLAGS[f]} by the pipeline; remove it"
              for f in flags if f in ADAPTER_FLAGS]
    try:
        build_config({f: v for f, v in {**file_data, **flags}.items() if f not in ADAPTER_FLAGS}, where)
    except ConfigError as e:
        errors.append(str(e))
    if errors:
        raise ConfigError("\n".join(errors))
