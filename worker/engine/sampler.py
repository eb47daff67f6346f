"""Turn a step's logits into next tokens: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from worker.engine.sampling_params import SamplingParams


def top_k_top_p_mask(
    sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """True where a token is cut, for logits sorted descending along the last dim.

    top_k [N] (vocab size = off), top_p [N] (1.0 = off). The top token always survives.
    """
    ranks = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)
    cut = ranks.unsqueeze(0) >= top_k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(cut, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    cut |= mass_before >= top_p.unsqueeze(1)
    cut[:, 0] = False
    return cut


class Sampler:
    """Holds one generator per seeded request so its draws do not depend on batching."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}
        self._default = torch.Generator(device=device)
        self._default.seed()

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self._generators[request_id] = gen
        return gen

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int | Exception]:
        """One token per row, or the exception that row raised (the request fails alone)."""
        greedy = logits.argmax(dim=-1).tolist()
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not random_rows:
            return list(greedy)
        out: list[int | Exception] = list(greedy)
        rows = torch.tensor(random_rows, device=logits.device)
        vocab = logits.shape[-1]
        temps = torch.tensor([params[i].temperature for i in random_rows], device=logits.device)
        top_k = torch.tensor(
            [params[i].top_k if params[i].top_k > 0 else vocab for i in random_rows],
            device=logits.device,
        )
        top_p = torch.tensor([params[i].top_p for i in random_rows], device=logits.device)
        scaled = logits[rows] / temps.unsqueeze(1)
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
        sorted_logits = sorted_logits.masked_fill(
            top_k_top_p_mask(sorted_logits, top_k, top_p), float("-inf")
        )
        probs = torch.softmax(sorted_logits, dim=-1)
        for j, i in enumerate(random_rows):
            try:
                gen = self._generator(request_ids[i], params[i])
                pick = torch.multinomial(probs[j], 1, generator=gen)
                out[i] = int(sorted_ids[j, pick].item())
            except Exception as e:
                out[i] = e
        return out
