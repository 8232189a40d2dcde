"""The output projection screened in bf16 (the `screened` verifier kind): an exact argmax(-1) at about half the
fp32 head's memory traffic, where the CPU has native bf16 dot products (rest_lsp/model/probes.py cpu_has_bf16).
Other logits are bf16 approximations, so a verifier over it sets `exact_logits` False and scores tokens through
`row_scorer` exactly (rest_lsp/model/fast.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import pad_rows


class ScreenedHead(torch.nn.Module):
    """The output projection with an exact argmax at half the memory traffic.

    A bf16 product over a bf16 copy of the weight screens the vocabulary; only tokens whose logit could
    still be the row's maximum get their fp32 logit computed exactly (a gather of a few weight rows).
    Bound, for row x and token v with fp32 weight row w and bf16 copies x~, w~ (u = 2^-8, bf16's unit
    roundoff; g = gamma_(K+2) = (K+2) 2^-24 / (1 - (K+2) 2^-24), fp32 accumulation over K terms):
        |x.w - out_v| <= |x.(w - w~)| + |(x - x~).w~| + |fp32 sum error| + |bf16 output rounding|
                      <= |x| e_v  +  u |x| |w~|  +  g |x~| |w~|  +  u/(1-u) |out_v|
    with e_v = |w - w~| (exact: the difference of an fp32 and its bf16 rounding is representable), and the
    fp32 recomputation of a candidate is within g |x| |w| of x.w. Every token whose interval reaches the
    largest lower end is a candidate, so the exact argmax is always among them; a non-candidate's returned
    (approximate) logit lies below that argmax's exact logit, so `logits.argmax(-1)` is exact, and so is
    every candidate's value. Other values are the bf16 approximations: good for drafting, not for sampling.
    """

    def __init__(self, weight: torch.Tensor, min_rows: int = 1):
        super().__init__()
        self.min_rows = min_rows
        w = weight.detach().float()
        k = w.shape[1]
        u = 2.0 ** -8
        g = (k + 2) * 2.0 ** -24 / (1 - (k + 2) * 2.0 ** -24)
        wb = w.to(torch.bfloat16)
        wb_norm = wb.float().norm(dim=1)
        err = (w - wb.float()).norm(dim=1)
        # per-token coefficient of |x| in the bound (|x~| <= (1+u)|x|); 1% over for the norms' own rounding
        self.register_buffer("coef", 1.01 * (err + u * wb_norm + g * ((1 + u) * wb_norm + w.norm(dim=1))),
                             persistent=False)
        self.out_round = 1.01 * u / (1 - u)
        self.register_buffer("weight", w, persistent=False)  # fp32 rows for the exact recomputation
        self.register_buffer("packed_bf16", torch.ops.mkldnn._reorder_linear_weight(wb, 8), persistent=False)
        self.max_candidates = 4096  # beyond this many (a nearly flat row) one exact full product is cheaper
        self.last_candidates = 0  # candidates in the last call (for benchmarks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [M, K] fp32 -> logits [M, V] fp32
        xb = pad_rows(x.to(torch.bfloat16), self.min_rows)
        approx = torch.ops.mkldnn._linear_pointwise(xb, self.packed_bf16, None, "none", [], "")
        approx = approx[: x.shape[0]].float()  # [M, V]
        bound = x.norm(dim=1, keepdim=True) * self.coef + self.out_round * approx.abs() + 1e-5  # [M, V]
        lowest_winner = (approx - bound).amax(dim=1, keepdim=True)  # [M, 1]
        rows, cols = ((approx + bound) >= lowest_winner).nonzero(as_tuple=True)  # candidates
        self.last_candidates = int(rows.numel())
        if rows.numel() > self.max_candidates * x.shape[0]:
            return F.linear(x, self.weight)
        approx[rows, cols] = (x[rows] * self.weight[cols]).sum(-1)  # exact fp32 for the candidates
        return approx
