"""The `vattn` attention backend for sglang 0.5.23: its Triton backend, with target verify,
draft extend and decode served by vattn where the shape is supported.

Everything else (prefill, mixed, idle, MLA, sliding window, softcap, sinks, topk > 1, ...) goes to
TritonAttnBackend untouched, and so does every call while `VATTN=0`. vattn's inputs (block
tables, KV lengths, the plan) are built once per forward, on the GPU, in the same hooks sglang
uses for its own metadata: `init_forward_metadata` (eager) and `init_forward_metadata_in_graph`
(recorded into each CUDA graph and replayed with it). If vattn fails to build or launch the
first time, one warning line is logged, vattn is off for the process, and the base serves.

Importing this module imports sglang; `vattn.sglang.register()` is the light entry point.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from vattn import switch
from vattn.sglang import gate, metadata

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class _ProcessState:
    """vattn's process-wide switch after a failure: one warning, then the base for good."""

    disabled: Optional[str] = None

    @classmethod
    def fail(cls, where: str, exc: BaseException) -> None:
        if cls.disabled is None:
            cls.disabled = f"{where}: {type(exc).__name__}: {exc}"
            logger.warning("vattn disabled for this process (%s); serving with the Triton backend",
                           cls.disabled.splitlines()[0])


def forward_mode_name(forward_mode) -> Optional[str]:
    """sglang ForwardMode -> the gate's mode name, or None for modes vattn never serves."""
    if forward_mode.is_target_verify():
        return "target_verify"
    if forward_mode.is_draft_extend_v2():
        return "draft_extend"
    if forward_mode.is_decode():
        return "decode"
    return None


def model_facts(backend: TritonAttnBackend, model_runner) -> gate.ModelFacts:
    cfg = model_runner.model_config
    return gate.ModelFacts(
        head_dim=int(cfg.head_dim), v_head_dim=int(backend.v_head_dim),
        num_q_heads=int(backend.num_head), num_kv_heads=int(backend.num_kv_head),
        page_size=int(backend.page_size),
        kv_dtype=_DTYPE_NAMES.get(model_runner.kv_cache_dtype, str(model_runner.kv_cache_dtype)),
        q_dtype=_DTYPE_NAMES.get(model_runner.dtype, str(model_runner.dtype)),
        sliding_window=backend.sliding_window_size is not None and backend.sliding_window_size > 0,
        use_mla=bool(backend.use_mla), dcp_size=int(backend.dcp_size),
        translated_kv_ids=bool(getattr(backend.kv_index_translator, "is_translating", False)),
        speculative_topk=int(backend.topk or 0),
        verify_q_len=int(backend.target_verify_num_tokens_per_req or 0))


def layer_facts(layer, sinks, score_mod, aux_tensors) -> gate.LayerFacts:
    return gate.LayerFacts(
        head_dim=layer.qk_head_dim, v_head_dim=layer.v_head_dim, logit_cap=layer.logit_cap or 0.0,
        sliding_window_size=layer.sliding_window_size, is_cross_attention=bool(layer.is_cross_attention),
        decoder_causal=layer.attn_type == AttentionType.DECODER, has_sinks=sinks is not None,
        has_score_mod=score_mod is not None or aux_tensors is not None,
        xai_temperature_len=getattr(layer, "xai_temperature_len", -1))


class VattnAttnBackend(TritonAttnBackend):
    """TritonAttnBackend with vattn on the few-query modes (see the module docstring)."""

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, *, dllm_fa4: bool = False):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, dllm_fa4=dllm_fa4)
        self.model_dtype = model_runner.dtype
        self._vattn_kv_dtype = model_runner.kv_cache_dtype  # not `kv_cache_dtype`: sglang reads that off backends
        self._vattn_max_batch = int(model_runner.req_to_token_pool.size)
        self.vattn_reason = None if switch.enabled() else "VATTN=0"
        self.plan_mode = switch.plan_mode()
        self.vattn_reason = self.vattn_reason or gate.model_reason(model_facts(self, model_runner))
        # the workspace's tile holds max_q_len * G rows: size it for this server's draft window only
        widest = max(int(self.target_verify_num_tokens_per_req or 1), int(self.num_draft_tokens or 1))
        self.vattn_max_q_len = max(1, min(gate.MAX_Q_LEN, widest))
        self._workspace = None
        self._unit_descale = None
        self._inputs: Optional[metadata.ForwardInputs] = None
        self._batch = None  # the ForwardBatch _inputs were built for
        self._layer_ok: dict = {}
        logger.info("vattn backend: %s", f"on (plan {self.plan_mode})" if self.vattn_reason is None
                    else f"off ({self.vattn_reason})")

    # -- metadata: once per forward --------------------------------------------------------------

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._prepare(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch):
        super().init_forward_metadata_in_graph(forward_batch)
        self._prepare(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None,
                              cuda_graph_num_kv_splits_buf=None):
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf, cuda_graph_num_kv_splits_buf)
        if self._workspace is None:  # a graph batch may exceed the request pool; size for both
            self._vattn_max_batch = max(self._vattn_max_batch, int(max_bs))

    def _active(self) -> bool:
        return self.vattn_reason is None and _ProcessState.disabled is None

    def _forward_q_len(self, mode: str, forward_batch) -> int:
        if mode == "target_verify":
            return self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        if mode == "decode":
            return 1
        return int(self.forward_metadata.max_extend_len or 0)  # draft extend: uniform per request

    def _prepare(self, forward_batch) -> None:
        """Build this forward's vattn inputs, or leave None so every layer uses the base."""
        self._inputs = self._batch = None
        mode = forward_mode_name(forward_batch.forward_mode)
        if mode is None or not self._active():
            return
        spec = forward_batch.spec_info
        if mode == "decode" and spec is not None and getattr(spec, "kv_indptr", None) is not None:
            return  # a multi-step draft step reads its own chain, not req_to_token
        q_len = self._forward_q_len(mode, forward_batch)
        too_big = forward_batch.req_pool_indices.shape[0] > self._vattn_max_batch
        if too_big or not 1 <= q_len <= self.vattn_max_q_len:
            return
        try:
            self._batch = forward_batch  # the inputs belong to this batch only (checked per layer)
            self._inputs = metadata.build(
                mode, q_len, self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens,
                page_size=self.page_size, num_kv_heads=self.num_kv_head, plan_mode=self.plan_mode,
                workspace=self._get_workspace())
        except Exception as exc:  # first-use build/compile failure: warn once, serve with the base
            _ProcessState.fail("plan", exc)

    def _get_workspace(self):
        if self._workspace is None:
            import vattn

            self._workspace = vattn.Workspace(
                head_dim=self.v_head_dim, num_q_heads=self.num_head, num_kv_heads=self.num_kv_head,
                kv_dtype=self._vattn_kv_dtype, q_dtype=self.model_dtype, page_size=self.page_size,
                max_q_len=self.vattn_max_q_len, max_batch=self._vattn_max_batch, device=self.device)
        return self._workspace

    # -- forward: per layer ----------------------------------------------------------------------

    def _serves(self, layer, forward_batch, q, sinks, score_mod, aux_tensors) -> bool:
        inputs = self._inputs
        if inputs is None or not self._active() or forward_batch is not self._batch:
            return False
        if forward_mode_name(forward_batch.forward_mode) != inputs.mode:
            return False
        if q.shape[0] != inputs.batch * inputs.q_len:
            return False
        key = (layer.layer_id, inputs.mode, inputs.q_len, sinks is None, score_mod is None and aux_tensors is None)
        if key not in self._layer_ok:
            facts = layer_facts(layer, sinks, score_mod, aux_tensors)
            self._layer_ok[key] = gate.layer_reason(facts, inputs.mode, inputs.q_len) is None
        return self._layer_ok[key]

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       score_mod=None, aux_tensors=None):
        return self._vattn_or_base(super().forward_extend, q, k, v, layer, forward_batch, save_kv_cache,
                                   sinks, score_mod, aux_tensors)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       score_mod=None, aux_tensors=None):
        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)  # as the base: decode output is [T, H*D]
        return self._vattn_or_base(super().forward_decode, q, k, v, layer, forward_batch, save_kv_cache,
                                   sinks, score_mod, aux_tensors)

    def _vattn_or_base(self, base_forward, q, k, v, layer, forward_batch, save_kv_cache, sinks, score_mod,
                       aux_tensors):
        """vattn where the gate lets this layer and batch through, else (or if vattn declines) the base."""
        if k is not None and v is not None and self._serves(layer, forward_batch, q, sinks, score_mod,
                                                            aux_tensors):
            out = self._forward_vattn(q, k, v, layer, forward_batch, save_kv_cache)
            if out is not None:
                return out
        return base_forward(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, sinks=sinks,
                            score_mod=score_mod, aux_tensors=aux_tensors)

    def _save_kv(self, forward_batch, layer, k, v) -> None:
        """The base's own KV write (non-MLA, no DCP: the gate refuses those)."""
        loc = KVWriteLoc.for_batch(forward_batch, swa_loc=self.forward_metadata.swa_out_cache_loc)
        if layer.k_scale is None:
            self._set_kv_buffer(forward_batch, layer, loc, k, v)
        else:  # clones: the pool scales in place, and the base may still need k, v on a fallback
            self._set_kv_buffer(forward_batch, layer, loc, k.clone(), v.clone(), layer.k_scale, layer.v_scale)

    def _descales(self, layer, kv_dtype):
        if kv_dtype != torch.float8_e4m3fn:
            return None, None
        if layer.k_scale is None:  # an fp8 cache without checkpoint scales: sglang reads it unscaled
            if self._unit_descale is None:
                self._unit_descale = torch.ones(1, dtype=torch.float32, device=self.device)
            return self._unit_descale, self._unit_descale
        return (layer.k_scale.detach().reshape(1).to(torch.float32),
                layer.v_scale.detach().reshape(1).to(torch.float32))

    def _forward_vattn(self, q, k, v, layer, forward_batch, save_kv_cache):
        """Write this layer's new K/V, then run vattn; None means 'failed: let the base serve'."""
        import vattn

        inputs = self._inputs
        if save_kv_cache:
            self._save_kv(forward_batch, layer, k, v)
        heads, dim = layer.tp_q_head_num, layer.qk_head_dim
        k_cache = metadata.paged_view(self.token_to_kv_pool.get_key_buffer(layer.layer_id), self.page_size)
        v_cache = metadata.paged_view(self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.page_size)
        k_descale, v_descale = self._descales(layer, k_cache.dtype)
        q3 = q.reshape(-1, heads, dim)
        out = torch.empty_like(q3)
        try:
            _attention(vattn, q3, k_cache, v_cache, inputs, k_descale, v_descale, float(layer.scaling), out)
        except Exception as exc:  # first-use compile/launch failure: warn once, serve with the base
            _ProcessState.fail("attention", exc)
            return None
        return out.view(q.shape[0], heads * dim) if q.dim() == 2 else out.view(q.shape)


@torch.compiler.disable  # as the base wraps its kernels: host checks and launches stay out of dynamo
def _attention(vattn, q, k_cache, v_cache, inputs, k_descale, v_descale, scale, out):
    vattn.attention(q, k_cache, v_cache, inputs.block_tables, inputs.seq_lens, inputs.cu_seqlens_q,
                    k_descale, v_descale, scale, plan=inputs.plan, out=out)


def create_vattn_backend(runner):
    """sglang's registry factory: the same preconditions as its Triton factory."""
    if runner.model_config.is_encoder_decoder:
        raise ValueError("attention_backend 'vattn': cross attention is not supported (it builds on the "
                         "Triton backend); use --attention-backend flashinfer")
    return VattnAttnBackend(runner)
