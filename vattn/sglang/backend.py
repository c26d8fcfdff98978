"""The `vattn` attention backend: sglang's production backend (the base) with vattn serving the
few-query modes of a speculative-decoding cycle where the gate accepts them.

The wrapper holds the base, built by sglang's own registry (`ATTENTION_BACKENDS[name](runner)`)
or, for the EAGLE draft, by sglang's draft factory. Routing, decided once per forward:
- `VATTN=1`: target verify, draft extend (V2) and decode go to vattn where the gate accepts
  the model, the batch and the layer; everything else (prefill/extend, mixed, idle, the draft's
  multi-step decode, unsupported shapes) to the base, untouched;
- `VATTN=0`: every call to the base; the wrapper only counts.
The base always prepares its own metadata too, so any layer vattn declines (or a first-use
failure: one warning, vattn off for the process) is served by the base in the same forward.

Delegation: every name sglang's `AttentionBackend` declares (methods, flags, the CUDA-graph
hooks, `forward_metadata`, ...) that this class does not override goes to the base, for
reading and writing; so does any other attribute (`__getattr__` / `__setattr__`), except the
wrapper's own, which all start with `vattn_`. sglang therefore sees the base's flags and state.

Importing this module imports sglang; `vattn.sglang.register()` is the light entry point.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType

from vattn import switch
from vattn.sglang import compat, counters, gate, metadata

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_LAYER_KWARGS = ("sinks", "score_mod", "aux_tensors")  # what layer_facts reads; any other kwarg -> base
_STAMPS = ("prefill_attention_backend_str", "decode_attention_backend_str")


class _ProcessState:
    """vattn's process-wide switch after a failure: one warning, then the base for good."""

    disabled: Optional[str] = None

    @classmethod
    def fail(cls, where: str, exc: BaseException, base_name: str) -> None:
        if cls.disabled is None:
            cls.disabled = f"{where}: {type(exc).__name__}: {exc}"
            logger.warning("vattn disabled for this process (%s); serving with the %s backend",
                           cls.disabled.splitlines()[0], base_name)


def mode_key(forward_mode) -> str:
    """sglang ForwardMode -> the counters' mode name (vattn serves the first three)."""
    if forward_mode.is_target_verify():
        return "target_verify"
    if forward_mode.is_draft_extend_v2():
        return "draft_extend"
    if forward_mode.is_decode():
        return "decode"
    if forward_mode.is_extend():  # prefill, mixed, the V1 draft extend
        return "extend"
    return "other"  # idle, prebuilt, ...


def forward_mode_name(forward_mode) -> Optional[str]:
    """sglang ForwardMode -> the gate's mode name, or None for modes vattn never serves."""
    key = mode_key(forward_mode)
    return key if key in gate.MODES else None


def model_facts(runner) -> gate.ModelFacts:
    """The gate's model-level facts, from the model runner and sglang's runtime context."""
    from sglang.srt.configs.model_config import AttentionArch

    cfg, par, sp = runner.model_config, compat.parallel(), compat.spec()
    window = getattr(runner, "sliding_window_size", None)
    return gate.ModelFacts(
        head_dim=int(cfg.head_dim), v_head_dim=int(getattr(cfg, "v_head_dim", cfg.head_dim)),
        num_q_heads=int(cfg.get_max_num_attention_heads()) // par["attn_tp_size"],
        num_kv_heads=int(cfg.get_num_kv_heads(par["attn_tp_size"])), page_size=int(runner.page_size or 1),
        kv_dtype=_DTYPE_NAMES.get(runner.kv_cache_dtype, str(runner.kv_cache_dtype)),
        q_dtype=_DTYPE_NAMES.get(runner.dtype, str(runner.dtype)),
        sliding_window=window is not None and window > 0, use_mla=cfg.attention_arch == AttentionArch.MLA,
        dcp_size=par["attn_dcp_size"], translated_kv_ids=compat.translated_kv_ids(runner),
        speculative_topk=sp["topk"], verify_q_len=compat.verify_q_len(runner))


def layer_facts(layer, kwargs: dict) -> gate.LayerFacts:
    return gate.LayerFacts(
        head_dim=layer.qk_head_dim, v_head_dim=layer.v_head_dim, logit_cap=layer.logit_cap or 0.0,
        sliding_window_size=layer.sliding_window_size, is_cross_attention=bool(layer.is_cross_attention),
        decoder_causal=layer.attn_type == AttentionType.DECODER, has_sinks=kwargs.get("sinks") is not None,
        has_score_mod=kwargs.get("score_mod") is not None or kwargs.get("aux_tensors") is not None,
        xai_temperature_len=getattr(layer, "xai_temperature_len", -1))


class VattnAttnBackend(AttentionBackend):
    """`base` with vattn on the few-query modes (see the module docstring)."""

    def __init__(self, base, model_runner, base_name: str):
        self.vattn_base = base  # every attribute not starting with vattn_ lives on the base
        self.vattn_base_name = base_name
        self.vattn_pool = model_runner.token_to_kv_pool
        self.vattn_req_to_token = model_runner.req_to_token_pool.req_to_token
        self.vattn_device = model_runner.device
        facts = model_facts(model_runner)
        self.vattn_facts = facts
        self.vattn_max_batch = int(model_runner.req_to_token_pool.size)
        # the workspace's tile holds max_q_len * G rows: size it for this server's draft window only
        widest = max(facts.verify_q_len, compat.spec()["draft_tokens"], 1)
        self.vattn_max_q_len = max(1, min(gate.MAX_Q_LEN, widest))
        switch.check()  # every switch value set, VATTN=0 or not: a typo in either arm is named at start-up
        self.vattn_plan_mode = switch.plan_mode()
        self.vattn_qk = switch.qk_mode()  # "e4m3": the lossy one-pass Q.K^T, named in the log line below
        self.vattn_reason = self._vattn_model_reason(facts) if switch.enabled() else "VATTN=0"
        self.vattn_workspace = self.vattn_unit_descale = None
        self.vattn_inputs: Optional[metadata.ForwardInputs] = None
        self.vattn_batch = None  # the ForwardBatch vattn_inputs were built for
        self.vattn_layer_ok: dict = {}
        self.vattn_graphs: dict = {}  # (mode, graph batch) -> q_len vattn recorded at capture, 0: the base
        publisher = compat.parallel()["attn_tp_rank"] == 0  # TP ranks see the same batches: count once
        self.vattn_counters = counters.process_counters(base_name, publisher=publisher)
        qk = "" if self.vattn_qk == "split" else f", Q.K^T {self.vattn_qk}: lossy"
        # VATTN on but the model refused: the on arm serves every call with the base, so say it loudly
        level = logging.WARNING if switch.enabled() and self.vattn_reason is not None else logging.INFO
        logger.log(level, "vattn backend: %s, base %s", f"on (plan {self.vattn_plan_mode}{qk})"
                   if self.vattn_reason is None else f"off ({self.vattn_reason})", base_name)

    def _vattn_model_reason(self, facts) -> Optional[str]:
        # vattn reads NHD pages [slots / P, P, Hkv, D]; sglang 0.5.23 labels the pool's physical
        # layout ("hnd", ROCm's "vectorized_5d", "page_major_layer_major"), 0.5.17 has use_hnd only
        layout = getattr(self.vattn_pool, "kv_cache_layout", "nhd")
        if layout != "nhd":
            return f"KV cache layout {layout!r} (served: 'nhd')"
        if getattr(self.vattn_pool, "use_hnd", False):
            return "HND KV pool layout"
        return gate.model_reason(facts)

    # -- delegation ------------------------------------------------------------------------------

    def __getattr__(self, name):  # only reached when normal lookup fails
        if name.startswith("vattn_"):
            raise AttributeError(name)
        return getattr(self.vattn_base, name)

    def __setattr__(self, name, value):
        if name.startswith("vattn_"):
            object.__setattr__(self, name, value)
            return
        if name in _STAMPS and value == "vattn":
            # sglang stamps the resolved backend name for model-side dispatch; the base's name is
            # what that dispatch understands, and what it sees when VATTN=0
            value = self.vattn_base_name
        setattr(self.vattn_base, name, value)

    # -- metadata: the per-forward decision, counted once per forward ----------------------------

    def init_forward_metadata(self, forward_batch):
        self.vattn_base.init_forward_metadata(forward_batch)
        q_len = self._vattn_decide(forward_batch)
        self._vattn_count(forward_batch, q_len)
        self._vattn_prepare(forward_batch, q_len)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False, **kwargs):
        """Eager before each replay (and before a capture): the replay's count happens here.

        A replay runs the kernels its capture recorded, whatever Python would decide now, so it
        is counted by that capture's decision (the graph is keyed by mode and padded batch)."""
        self.vattn_base.init_forward_metadata_out_graph(forward_batch, in_capture, **kwargs)
        if not in_capture:
            q_len = self.vattn_graphs.get(_graph_key(forward_batch))
            self._vattn_count(forward_batch, self._vattn_decide(forward_batch) if q_len is None else q_len)

    def init_forward_metadata_in_graph(self, forward_batch):
        """Recorded into the graph: vattn's tables and plan land in tensors allocated during the
        capture, which stay put and are rewritten by every replay."""
        self.vattn_base.init_forward_metadata_in_graph(forward_batch)
        self._vattn_prepare(forward_batch, self._vattn_decide(forward_batch))
        served = self.vattn_inputs.q_len if self.vattn_inputs is not None else 0
        self.vattn_graphs[_graph_key(forward_batch)] = served

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        self.vattn_base.init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self.vattn_workspace is None:  # a graph batch may exceed the request pool; size for both
            self.vattn_max_batch = max(self.vattn_max_batch, int(max_bs))

    @property
    def supports_ragged_verify_graph(self) -> bool:
        """sglang replays a token-bucket verify graph for a ragged batch only when this is True.
        vattn's tables and plan are recorded at capture for uniform rows and never rebuilt per
        replay, so while vattn may serve this model the answer is no (also after a fallback: the
        graphs captured before it still hold vattn's launches); otherwise the base's answer."""
        return False if self.vattn_reason is None else self.vattn_base.supports_ragged_verify_graph

    def _vattn_active(self) -> bool:
        return self.vattn_reason is None and _ProcessState.disabled is None

    def _vattn_decide(self, forward_batch) -> int:
        """Query tokens per sequence when vattn serves this forward, else 0. Host facts only."""
        mode = forward_mode_name(forward_batch.forward_mode)
        if mode is None or not self._vattn_active():
            return 0
        spec = forward_batch.spec_info
        if mode == "decode" and spec is not None and getattr(spec, "kv_indptr", None) is not None:
            return 0  # a multi-step draft step reads its own chain, not req_to_token
        loc = getattr(forward_batch, "out_cache_loc", None)
        if loc is None:
            return 0
        rows, real = _rows(forward_batch)
        tokens = int(loc.shape[0])
        if real <= 0 or rows > self.vattn_max_batch or tokens % real:
            return 0  # ragged or oversized: the base serves
        q_len = tokens // real
        if mode == "decode" and q_len != 1:
            return 0
        if mode == "target_verify" and _verify_width(spec) not in (0, q_len):
            return 0  # a ragged verify batch whose total happens to divide evenly: not uniform
        return q_len if 1 <= q_len <= self.vattn_max_q_len else 0

    def _vattn_count(self, forward_batch, q_len: int) -> None:
        self.vattn_counters.count("vattn" if q_len else "base", mode_key(forward_batch.forward_mode))

    def _vattn_prepare(self, forward_batch, q_len: int) -> None:
        """Build this forward's vattn inputs, or leave None so every layer uses the base."""
        self.vattn_inputs = self.vattn_batch = None
        if not q_len:
            return
        try:
            self.vattn_batch = forward_batch  # the inputs belong to this batch only (checked per layer)
            self.vattn_inputs = metadata.build(
                forward_mode_name(forward_batch.forward_mode), q_len, self.vattn_req_to_token,
                forward_batch.req_pool_indices, forward_batch.seq_lens, page_size=self.vattn_facts.page_size,
                num_kv_heads=self.vattn_facts.num_kv_heads, plan_mode=self.vattn_plan_mode,
                workspace=self._vattn_workspace())
        except Exception as exc:  # first-use build/compile failure: warn once, serve with the base
            self.vattn_batch = None
            _ProcessState.fail("plan", exc, self.vattn_base_name)

    def _vattn_workspace(self):
        if self.vattn_workspace is None:
            import vattn

            f = self.vattn_facts
            self.vattn_workspace = vattn.Workspace(
                head_dim=f.v_head_dim, num_q_heads=f.num_q_heads, num_kv_heads=f.num_kv_heads,
                kv_dtype=self.vattn_pool.dtype, q_dtype=_dtype(f.q_dtype), page_size=f.page_size,
                max_q_len=self.vattn_max_q_len, max_batch=self.vattn_max_batch, device=self.vattn_device,
                qk=self.vattn_qk)
        return self.vattn_workspace

    # -- forward: per layer ----------------------------------------------------------------------

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        out = self._vattn_forward(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        if out is not None:
            return out
        return self.vattn_base.forward(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        out = self._vattn_forward(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        if out is not None:
            return out
        return self.vattn_base.forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        out = self._vattn_forward(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        if out is not None:
            return out
        return self.vattn_base.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def _vattn_serves(self, layer, forward_batch, q, kwargs) -> bool:
        inputs = self.vattn_inputs
        if inputs is None or not self._vattn_active() or forward_batch is not self.vattn_batch:
            return False
        if forward_mode_name(forward_batch.forward_mode) != inputs.mode:
            return False
        if q.shape[0] != inputs.batch * inputs.q_len:
            return False
        if any(value is not None for name, value in kwargs.items() if name not in _LAYER_KWARGS):
            return False  # MLA ropes, descales, indexer inputs...: what only the base understands
        key = (layer.layer_id, inputs.mode, inputs.q_len, tuple(kwargs.get(n) is None for n in _LAYER_KWARGS))
        if key not in self.vattn_layer_ok:
            reason = gate.layer_reason(layer_facts(layer, kwargs), inputs.mode, inputs.q_len)
            if reason is not None:
                logger.info("vattn: layer %s %s stays on %s (%s)", layer.layer_id, inputs.mode,
                            self.vattn_base_name, reason)
            self.vattn_layer_ok[key] = reason is None
        return self.vattn_layer_ok[key]

    def _vattn_forward(self, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
        """Write this layer's new K/V, then run vattn; None means 'the base serves this call'."""
        if k is None or v is None or not self._vattn_serves(layer, forward_batch, q, kwargs):
            return None
        import vattn

        inputs, pool, page = self.vattn_inputs, self.vattn_pool, self.vattn_facts.page_size
        if save_kv_cache:
            loc = compat.write_loc(forward_batch)
            if layer.k_scale is None:
                pool.set_kv_buffer(layer, loc, k, v)
            else:  # clones: the pool scales in place, and the base may still need k, v on a fallback
                pool.set_kv_buffer(layer, loc, k.clone(), v.clone(), layer.k_scale, layer.v_scale)
        k_cache = metadata.paged_view(pool.get_key_buffer(layer.layer_id), page)
        v_cache = metadata.paged_view(pool.get_value_buffer(layer.layer_id), page)
        k_descale, v_descale = self._vattn_descales(layer, k_cache.dtype)
        heads, dim = layer.tp_q_head_num, layer.qk_head_dim
        q3 = q.reshape(-1, heads, dim)
        out = torch.empty_like(q3)
        try:
            _attention(vattn, q3, k_cache, v_cache, inputs, k_descale, v_descale, float(layer.scaling), out)
        except Exception as exc:  # first-use compile/launch failure: warn once, serve with the base
            _ProcessState.fail("attention", exc, self.vattn_base_name)
            return None
        return out.view(q3.shape[0], heads * dim)  # as the bases return it: [T, H * D]

    def _vattn_descales(self, layer, kv_dtype):
        if kv_dtype != torch.float8_e4m3fn:
            return None, None
        if layer.k_scale is None:  # an fp8 cache without checkpoint scales: sglang reads it unscaled
            if self.vattn_unit_descale is None:
                self.vattn_unit_descale = torch.ones(1, dtype=torch.float32, device=self.vattn_device)
            return self.vattn_unit_descale, self.vattn_unit_descale
        return (layer.k_scale.detach().reshape(1).to(torch.float32),
                layer.v_scale.detach().reshape(1).to(torch.float32))


def _rows(forward_batch) -> tuple[int, int]:
    """(rows, real rows) of a forward. A CUDA-graph replay pads the batch to the captured size:
    sglang's decode runner hands out_graph a view whose `batch_size`, `req_pool_indices` and
    `seq_lens` cover the padded rows, with `num_padding` of them, while `out_cache_loc` holds only
    the real rows' tokens; EAGLE's draft-extend runner passes its whole index buffer with
    `batch_size` set and pads `out_cache_loc` instead. `batch_size` is the graph's batch in both."""
    rows = getattr(forward_batch, "batch_size", None)
    if not isinstance(rows, int):
        rows = int(forward_batch.req_pool_indices.shape[0])
    return rows, rows - int(getattr(forward_batch, "num_padding", None) or 0)


def _graph_key(forward_batch) -> tuple[str, int]:
    return mode_key(forward_batch.forward_mode), _rows(forward_batch)[0]


def _verify_width(spec) -> int:
    """Draft tokens per request the verify input declares (0: not declared). 0.5.23 names it
    `num_tokens_per_req`, 0.5.17 `draft_token_num`."""
    for name in ("num_tokens_per_req", "draft_token_num"):
        value = getattr(spec, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _dtype(name: str):
    return getattr(torch, name)


@torch.compiler.disable  # as the bases wrap their kernels: host checks and launches stay out of dynamo
def _attention(vattn, q, k_cache, v_cache, inputs, k_descale, v_descale, scale, out):
    vattn.attention(q, k_cache, v_cache, inputs.block_tables, inputs.seq_lens, inputs.cu_seqlens_q,
                    k_descale, v_descale, scale, plan=inputs.plan, out=out)


def _forwarded_attr(name: str):
    """Read through to the base (writes already go there: see VattnAttnBackend.__setattr__)."""
    return property(lambda self: getattr(self.vattn_base, name), doc=f"the base backend's {name}")


def _forwarded_method(name: str, declared):
    @functools.wraps(declared)
    def call(self, *args, **kwargs):
        return getattr(self.vattn_base, name)(*args, **kwargs)

    return call


def _delegate_declared(cls, abc) -> None:
    """Forward every name `abc` declares and `cls` does not override to the base. Generated from
    the installed sglang's class, so each version's own hooks are covered without a list here."""
    for name, member in vars(abc).items():
        if name.startswith("__") or name.startswith("_abc") or name in vars(cls):
            continue
        if isinstance(member, (staticmethod, classmethod)) or not callable(member):
            setattr(cls, name, _forwarded_attr(name))  # flags, properties, declared state
        else:
            setattr(cls, name, _forwarded_method(name, member))


_delegate_declared(VattnAttnBackend, AttentionBackend)


def wrap(base, runner, base_name: str) -> VattnAttnBackend:
    return VattnAttnBackend(base, runner, base_name)


def create_vattn_backend(runner):
    """sglang's registry factory: the base from sglang's registry, wrapped."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from vattn.sglang import base as base_choice

    name, source = base_choice.resolve(runner)
    if name == "vattn" or name not in ATTENTION_BACKENDS:
        raise ValueError(f"vattn base: got {name!r} ({source}); allowed: a registered sglang attention "
                         f"backend such as {', '.join(base_choice.BASES)}")
    logger.info("vattn base: %s (%s)", name, source)
    return wrap(ATTENTION_BACKENDS[name](runner), runner, name)
