"""A linear-chain CRF over a tagger's per-word scores, its transitions constrained by the BIO/IOBES scheme.

Owns: which label follows which (`constraints`, read from the label names: BIO or IOBES, anything else is a
ConfigError naming head.crf), the module that holds the learned scores (`LinearChainCRF`: `transitions
[C, C]` (from row label to column label), `start [C]`, `end [C]`, saved with the model as `crf.*`), and the
three computations on them:

- `log_likelihood` (torch, batched, masked lengths): the training objective, the forward algorithm;
- `viterbi` (numpy, one sequence): the best tag sequence, what every consumer decodes with;
- `marginals` (numpy, one sequence, forward-backward): p(tag of word t = c), the per-word confidence.

Constraints are a fixed mask, not learned: a disallowed transition, start or end scores `DISALLOWED`
whatever the parameter under it holds (`LinearChainCRF.scores` applies the mask on every call, so the
masked entries get no gradient and stay impossible after any amount of training). BIO: I-X only after B-X
or I-X, never first. IOBES: B-X and I-X are followed by I-X or E-X; E-X, S-X and O by O, B-* or S-*; a
sequence never starts on I-/E- nor ends on B-/I-. The score is large and finite (not -inf) so that sums and
log-sum-exps of disallowed paths stay finite and gradients never become NaN.

A sequence is what the tagger predicts one label for: its words (a word's score is the logits of its first
sub-token). A training row becomes such a sequence here (`labelled_sequences`: its labelled positions moved to
its front), and a window's labels are trimmed where its edge cuts an entity (`trim_cut_entities`);
`families.tagging` gathers each example's words for decoding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.errors import ConfigError

# The score of a disallowed transition, start or end: exp(-1e4) is 0 in float32 and float64 alike.
DISALLOWED = -10000.0


class Constraints(NamedTuple):
    """Which tag sequences the scheme allows: transitions[i, j] (tag j may follow tag i), start [C], end [C]."""

    scheme: str
    transitions: np.ndarray
    start: np.ndarray
    end: np.ndarray


class CrfScores(NamedTuple):
    """A CRF's scores with the constraints applied: transitions [C, C], start [C], end [C].

    Torch tensors in training (they are part of the graph), float64 numpy arrays in decoding.
    """

    transitions: torch.Tensor | np.ndarray
    start: torch.Tensor | np.ndarray
    end: torch.Tensor | np.ndarray


def split_label(name: str) -> tuple[str, str] | None:
    """("O", "") for the outside label, (prefix, type) for "B-PER" and the like, None for anything else."""
    if name == "O":
        return "O", ""
    if len(name) > 2 and name[1] == "-" and name[0] in "BIES":
        return name[0], name[2:]
    return None


def constraints(label_names: Sequence[str]) -> Constraints:
    """The allowed transitions, starts and ends of a label set.

    Raises:
        ConfigError: labels that are not BIO/IOBES ("PER", "LOC" without prefixes), or an entity type whose
            labels cannot form a complete entity (I-PER without B-PER), naming head.crf and the fix.
    """
    names = list(label_names)
    parsed = [split_label(name) for name in names]
    if not names or any(p is None for p in parsed):
        raise ConfigError(f"head.crf needs BIO or IOBES labels (B-PER, I-PER, ...); got {names}; turn head.crf "
                          "off or convert the tags")
    scheme = "IOBES" if any(p[0] in "ES" for p in parsed) else "BIO"
    present = {(prefix, type_) for prefix, type_ in parsed}
    for prefix, type_ in sorted(present):
        needs = {"BIO": {"I": "B"}, "IOBES": {"I": "BE", "B": "E", "E": "B"}}[scheme].get(prefix, "")
        missing = [f"{p}-{type_}" for p in needs if (p, type_) not in present]
        if missing:
            raise ConfigError(f"head.crf: label {prefix}-{type_} can never be predicted under {scheme}: its entity "
                              f"needs {' and '.join(missing)}, which the labels {names} lack; add "
                              f"{' and '.join(missing)} to the labels or turn head.crf off")
    size = len(names)
    allowed = np.zeros((size, size), dtype=bool)
    for i, (before, before_type) in enumerate(parsed):
        for j, (after, after_type) in enumerate(parsed):
            if scheme == "BIO":
                allowed[i, j] = after != "I" or (before in ("B", "I") and before_type == after_type)
            elif before in ("B", "I"):
                allowed[i, j] = after in ("I", "E") and before_type == after_type
            else:  # E-, S- and O close whatever came before
                allowed[i, j] = after in ("O", "B", "S")
    start = np.array([p[0] not in ("I", "E") for p in parsed])
    end = np.array([scheme == "BIO" or p[0] not in ("B", "I") for p in parsed])
    return Constraints(scheme, allowed, start, end)


class LinearChainCRF(nn.Module):
    """The learned scores of a linear-chain CRF over `label_names`, and the scheme's fixed constraints.

    Parameters start at zero, so a fresh CRF decodes as the constrained arg-max of the tagger's scores.
    The masks are buffers that are not saved: they are rebuilt from the label names, which config.json holds.

    `lr_scale`: the optimizer trains these scores at this multiple of the learning rate of their group
    (`training.optim.parameter_groups`): C*C + 2C numbers starting at zero would hardly move at an encoder's
    2e-5..1e-4 in a few epochs, and CRF taggers commonly give them a rate about 100 times larger.
    """

    lr_scale = 100.0

    def __init__(self, label_names: Sequence[str]):
        super().__init__()
        rules = constraints(label_names)
        self.scheme = rules.scheme
        size = len(label_names)
        self.transitions = nn.Parameter(torch.zeros(size, size))  # [C, C] from row label to column label
        self.start = nn.Parameter(torch.zeros(size))  # [C]
        self.end = nn.Parameter(torch.zeros(size))  # [C]
        self.register_buffer("allowed_transitions", torch.from_numpy(rules.transitions), persistent=False)
        self.register_buffer("allowed_start", torch.from_numpy(rules.start), persistent=False)
        self.register_buffer("allowed_end", torch.from_numpy(rules.end), persistent=False)

    def scores(self) -> CrfScores:
        """The scores with the constraints applied (differentiable in the allowed entries only)."""
        return CrfScores(self.transitions.masked_fill(~self.allowed_transitions, DISALLOWED),
                         self.start.masked_fill(~self.allowed_start, DISALLOWED),
                         self.end.masked_fill(~self.allowed_end, DISALLOWED))

    def extra_repr(self) -> str:
        return f"labels={self.transitions.shape[0]}, scheme={self.scheme}"


# --- torch: training ------------------------------------------------------------------------------------

def path_score(emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor, scores: CrfScores) -> torch.Tensor:
    """Score of the given tag sequences: emissions [B, L, C], tags [B, L], mask [B, L] (a prefix of each row
    is real, at least one position) -> [B]."""
    transitions, start, end = scores
    real = mask.float()  # [B, L]
    emitted = emissions.gather(-1, tags[..., None]).squeeze(-1)  # [B, L]
    total = start[tags[:, 0]] + (emitted * real).sum(-1)
    if tags.shape[1] > 1:
        total = total + (transitions[tags[:, :-1], tags[:, 1:]] * real[:, 1:]).sum(-1)  # [B, L-1] summed
    last = tags.gather(1, (mask.sum(-1, keepdim=True) - 1).clamp(min=0)).squeeze(1)  # [B]
    return total + end[last]


def log_partition(emissions: torch.Tensor, mask: torch.Tensor, scores: CrfScores) -> torch.Tensor:
    """log Z of each row: the log-sum-exp of the scores of all tag sequences (forward algorithm).
    emissions [B, L, C], mask [B, L] (a prefix of each row is real) -> [B]."""
    transitions, start, end = scores
    alpha = start + emissions[:, 0]  # [B, C]
    for t in range(1, emissions.shape[1]):
        # [B, C, 1] + [C, C] + [B, 1, C] -> sum out the previous label -> [B, C]
        step = torch.logsumexp(alpha[:, :, None] + transitions + emissions[:, t, None, :], dim=1)
        alpha = torch.where(mask[:, t, None], step, alpha)
    return torch.logsumexp(alpha + end, dim=-1)


def log_likelihood(emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor,
                   scores: CrfScores) -> torch.Tensor:
    """log p(tags | emissions) of each row, in float32: emissions [B, L, C], tags [B, L] (any value where
    masked), mask [B, L] bool with the real positions first, L >= 1 -> [B]; a row with no real position
    gives 0."""
    emissions = emissions.float()
    scores = CrfScores(*(s.float() for s in scores))
    mask = mask.bool()
    tags = tags.long().masked_fill(~mask, 0)
    values = path_score(emissions, tags, mask, scores) - log_partition(emissions, mask, scores)
    return values.masked_fill(~mask[:, 0], 0.0)


# --- a tagger's rows as CRF sequences ---------------------------------------------------------------

def labelled_sequences(logits: torch.Tensor, labels: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's labelled positions moved to its front, in order: the rows' CRF sequences.

    logits [B, T, C], labels [B, T] -> (emissions [B, L, C], tags [B, L], mask [B, L]) with L the largest
    number of labelled positions in a row; mask marks the real positions (a prefix of each row).
    """
    keep = labels != IGNORE_INDEX  # [B, T]
    length = int(keep.sum(-1).max()) if keep.numel() else 0
    # A stable sort of "unlabelled" puts the labelled positions first and keeps their order.
    order = torch.argsort((~keep).to(torch.uint8), dim=-1, stable=True)[:, :length]  # [B, L]
    emissions = logits.gather(1, order[..., None].expand(-1, -1, logits.shape[-1]))  # [B, L, C]
    return emissions, labels.gather(1, order), keep.gather(1, order)


def trim_cut_entities(labels: Sequence[int], prefixes: Mapping[int, str], *, cut_before: bool,
                      cut_after: bool) -> list[int]:
    """A window's labels for a CRF tagger: IGNORE_INDEX on the words of an entity that the window's edge cuts.

    A CRF sequence may not start on I-/E- nor (IOBES) end on B-/I-, so a window that begins inside an
    entity (`cut_before`) drops that entity's leading I-/E- words, and one that ends inside an entity
    (`cut_after`) drops its trailing B-/I- words where the scheme has an end tag (E-). `prefixes`: label
    id -> its first letter ("O", "B", "I", "E", "S").
    """
    labels = list(labels)
    positions = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    if cut_before:
        for i in positions:
            prefix = prefixes[labels[i]]
            if prefix not in ("I", "E"):
                break
            labels[i] = IGNORE_INDEX
            if prefix == "E":
                break
    if cut_after and "E" in prefixes.values():
        for i in reversed(positions):
            if labels[i] == IGNORE_INDEX or prefixes[labels[i]] not in ("B", "I"):
                break
            labels[i] = IGNORE_INDEX
    return labels


# --- numpy: decoding ------------------------------------------------------------------------------------

def _logsumexp(values: np.ndarray, axis: int) -> np.ndarray:
    top = values.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(values - top).sum(axis=axis, keepdims=True))).squeeze(axis)


def as_numpy(scores: CrfScores) -> CrfScores:
    """float64 numpy copies of (possibly torch) scores, for decoding."""
    return CrfScores(*(np.asarray(s.detach().float().cpu() if isinstance(s, torch.Tensor) else s, dtype=np.float64)
                       for s in scores))


def viterbi(emissions: np.ndarray, scores: CrfScores) -> tuple[list[int], float]:
    """The highest-scoring tag sequence of one sequence and its score: emissions [L, C] (L >= 1)."""
    transitions, start, end = scores
    best = start + emissions[0]  # [C] best score of a path ending in each label
    pointers = []
    for t in range(1, len(emissions)):
        candidates = best[:, None] + transitions  # [C previous, C next]
        pointers.append(candidates.argmax(axis=0))  # [C]
        best = candidates.max(axis=0) + emissions[t]
    best = best + end
    path = [int(best.argmax())]
    for back in reversed(pointers):
        path.append(int(back[path[-1]]))
    return path[::-1], float(best.max())


def forward_backward(emissions: np.ndarray, scores: CrfScores) -> tuple[np.ndarray, np.ndarray, float]:
    """(alpha [L, C], beta [L, C], log Z) of one sequence, in log space: alpha[t, c] sums the paths over
    0..t ending in c, beta[t, c] the paths over t+1.. starting after c (with the end score)."""
    transitions, start, end = scores
    length = len(emissions)
    alpha = np.empty_like(emissions)
    beta = np.empty_like(emissions)
    alpha[0] = start + emissions[0]
    for t in range(1, length):
        alpha[t] = _logsumexp(alpha[t - 1][:, None] + transitions, axis=0) + emissions[t]
    beta[-1] = end
    for t in range(length - 2, -1, -1):
        beta[t] = _logsumexp(transitions + (emissions[t + 1] + beta[t + 1])[None, :], axis=1)
    return alpha, beta, float(_logsumexp(alpha[-1] + end, axis=0))


def marginals(emissions: np.ndarray, scores: CrfScores) -> np.ndarray:
    """p(label of position t = c) under the CRF, [L, C] from emissions [L, C]; rows sum to 1."""
    alpha, beta, log_z = forward_backward(emissions, scores)
    return np.exp(alpha + beta - log_z)
