"""A stand-in for the production bases (FA3, FlashInfer) on a CPU, below sglang's real interface.

FA3's and FlashInfer's kernels need a GPU, but to the wrapper a base is only an
`AttentionBackend`: these tests need to see which of its methods ran, with what, and that its
flags and state show through the wrapper. `RecordingBase` subclasses sglang's real
`AttentionBackend` (so its `forward` dispatch, idle handling included, is sglang's own), records
every call, and answers attention with zeros of the shape the real bases return ([T, H * Dv]).
`install(name)` puts it into sglang's registry under a real base's name, so the wrapper builds it
exactly as it builds FA3 on the H200.
"""
from __future__ import annotations


def recording_base_class():
    import torch
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    class RecordingBase(AttentionBackend):
        # differs from AttentionBackend's default: the wrapper must report the base's value
        supports_ragged_verify_graph = True
        needs_cpu_seq_lens = False

        def __init__(self, runner):
            self.runner = runner
            self.calls = []
            self.forward_metadata = "base-metadata"
            self.graph_state = None

        def _note(self, name, forward_batch=None, **extra):
            mode = None if forward_batch is None else forward_batch.forward_mode.name
            self.calls.append({"call": name, "mode": mode, **extra})

        def init_forward_metadata(self, forward_batch):
            self._note("init_forward_metadata", forward_batch)

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            self._note("out_graph", forward_batch, in_capture=in_capture)

        def init_forward_metadata_in_graph(self, forward_batch):
            self._note("in_graph", forward_batch)

        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            self.graph_state = (max_bs, max_num_tokens)
            self._note("init_cuda_graph_state", max_bs=max_bs)

        def get_cuda_graph_seq_len_fill_value(self):
            return 1

        def base_only_helper(self):  # a method the ABC does not declare: reached via __getattr__
            return "from the base"

        def _attend(self, name, q, layer, forward_batch, kwargs):
            self._note(name, forward_batch, kwargs=sorted(k for k, v in kwargs.items() if v is not None))
            return torch.zeros(q.shape[0], layer.tp_q_head_num * layer.v_head_dim, dtype=q.dtype)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            return self._attend("forward_extend", q, layer, forward_batch, kwargs)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            return self._attend("forward_decode", q, layer, forward_batch, kwargs)

    return RecordingBase


def install(name: str = "fa3"):
    """Register RecordingBase under `name` in sglang's attention registry; returns the class."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    cls = recording_base_class()
    ATTENTION_BACKENDS[name] = cls
    return cls
