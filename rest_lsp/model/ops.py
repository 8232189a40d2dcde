"""What both verifiers share (fast.py, static.py): the architectures they run, a decoder's norms and rotary embedding,
computed as transformers computes them (the same dtypes and order of operations), so that a verifier's logits match
the model's own forward, the two MLP layouts and the attention window; and the zero-row padding of the CPU's small
products (fast.py, screened.py)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_ARCHS = ("qwen2", "qwen3", "llama", "mistral", "starcoder2")  # transformers' model_type


class UnsupportedModel(ValueError):
    """A verifier cannot run this model (architecture, precision or device); the message says why."""


def attention_window(cfg: Any) -> int | None:
    """The sliding window of the model's attention, or None for full attention. A query at position p sees
    the keys at p - window + 1 .. p, so a cache of at most `window` positions is full attention, exactly: the
    verifiers cap their cache there (Mistral v0.1, StarCoder2: 4,096)."""
    window = getattr(cfg, "sliding_window", None)
    # Mistral and StarCoder2 have no switch: their window applies whenever it is set; Qwen2/3 have one
    on = getattr(cfg, "use_sliding_window", getattr(cfg, "model_type", None) in ("mistral", "starcoder2"))
    return int(window) if window and on else None


MLP_GATED = ("gate_proj", "up_proj", "down_proj")  # down(act(gate(x)) * up(x)): Llama, Qwen, Mistral
MLP_PLAIN = ("c_fc", "c_proj")  # c_proj(act(c_fc(x))): StarCoder2


def mlp_names(mlp: torch.nn.Module) -> tuple[str, ...]:
    """A transformers MLP's projections, the output last: MLP_GATED or MLP_PLAIN."""
    return MLP_GATED if hasattr(mlp, "gate_proj") else MLP_PLAIN


def mlp_act(mlp: torch.nn.Module):
    """The MLP's own activation (`act_fn` of a gated MLP, StarCoder2's `act`)."""
    return mlp.act_fn if hasattr(mlp, "gate_proj") else mlp.act


def norm_params(hf_norm: torch.nn.Module) -> tuple[bool, torch.Tensor, torch.Tensor | None, float]:
    """(is LayerNorm, weight, bias, eps) of a transformers norm: RMSNorm (Llama, Qwen, Mistral), or LayerNorm with
    its bias (StarCoder2), with the module's own epsilon."""
    if isinstance(hf_norm, torch.nn.LayerNorm):
        return True, hf_norm.weight, hf_norm.bias, float(hf_norm.eps)
    return False, hf_norm.weight, None, float(hf_norm.variance_epsilon)


def norm(x: torch.Tensor, layer: bool, weight: torch.Tensor, bias: torch.Tensor | None,
         eps: float) -> torch.Tensor:  # [..., D] -> [..., D]
    """`norm_params`' norm of x."""
    if layer:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return rms_norm(x, weight, eps)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' Qwen2RMSNorm/Qwen3RMSNorm/LlamaRMSNorm: normalise in fp32, scale in the weights' dtype
    if x.dtype == w.dtype == torch.float32:
        # torch's fused kernel: the same bits for fp32 inputs and weights, row by row (tests/model/test_ops.py), in one
        # call instead of seven (a decoding step makes 2 per layer)
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [M, K] with zero rows appended up to `rows` (oneDNN's products of 1-2 rows take a slower path)."""
    return x if x.shape[0] >= rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [heads, M, hd]; cos/sin [M, hd] (both halves repeated, as transformers builds them)
    h = x.shape[-1] // 2
    rotated = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rotated * sin
