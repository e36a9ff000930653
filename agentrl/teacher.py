"""A frozen teacher for distillation: loaded once, never trained, checked against the student's tokenizer.

Token-level distillation (`--algo distill`) scores the student's own token ids, on the student's context,
under the teacher, so the two must share a tokenizer: every token string mapped to the same id, and the
same special tokens (a vocabulary of the same size is not enough: two BPE merges learned on different text
give different ids to the same string). Sequence-level distillation (`agentrl distill --mode rejection`)
hands the teacher's episodes to the student as text, which the student re-tokenizes, and needs neither.

>>> from transformers import PreTrainedTokenizerFast
>>> from tokenizers import Tokenizer, models
>>> def tok(vocab):
...     return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="?")),
...                                    eos_token="?")
>>> tokenizer_difference(tok({"?": 0, "a": 1}), tok({"?": 0, "a": 1})) is None
True
>>> tokenizer_difference(tok({"?": 0, "a": 1}), tok({"?": 0, "b": 1}))
"the vocabularies differ (2 and 2 tokens): 'a' only in the student's, 'b' only in the teacher's"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.policy import Policy


class TeacherMismatch(ValueError):
    """No teacher can serve token-level distillation of this student: none given, or one with another tokenizer."""


def _few(items: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(t) for t in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """Why the two tokenizers may give different ids for the same text (their vocabularies as token -> id
    maps, then their special tokens), or None when they agree."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if sv != tv:
        only_s, only_t = sorted(set(sv) - set(tv)), sorted(set(tv) - set(sv))
        moved = sorted(t for t in set(sv) & set(tv) if sv[t] != tv[t])
        parts = [f"{_few(only_s)} only in the student's" if only_s else "",
                 f"{_few(only_t)} only in the teacher's" if only_t else "",
                 f"{_few(moved)} under other ids" if moved else ""]
        return f"the vocabularies differ ({len(sv)} and {len(tv)} tokens): " + ", ".join(p for p in parts if p)
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        s, t = getattr(student, name, None), getattr(teacher, name, None)
        if s != t:
            return f"their {name} differs ({s!r} and {t!r})"
    s_special, t_special = sorted(map(str, student.all_special_tokens)), sorted(map(str, teacher.all_special_tokens))
    if s_special != t_special:
        return f"their special tokens differ ({_few(s_special)} and {_few(t_special)})"
    return None


def check_same_tokenizer(student: Any, teacher: Any, student_name: str, teacher_name: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's for token-level use, naming both and the way on."""
    why = tokenizer_difference(student, teacher)
    if why is not None:
        raise TeacherMismatch(
            f"teacher {teacher_name} cannot score the tokens of student {student_name}: {why}. Token-level "
            "distillation (--algo distill) needs the student's tokenizer; with another one, distill at the sequence "
            "level (agentrl distill --mode rejection: the teacher's passing episodes become the student's SFT data)")


def load_teacher(name: str | Path, device: str | torch.device = "cpu", tool_format: str | None = None) -> Policy:
    """The teacher as a `Policy` (its own tokenizer and chat layout), frozen: eval mode, no gradients."""
    teacher = Policy.load(name, device=device, tool_format=tool_format)
    teacher.model.eval().requires_grad_(False)
    return teacher


def token_level_teacher(name: str | Path | None, student: Policy, student_name: str,
                        device: str | torch.device = "cpu", algo: str = "distill") -> Policy:
    """The teacher for `--algo distill` (`algo`: the assigner that reads it): loaded frozen, and refused
    (`TeacherMismatch`) unless it shares the student's tokenizer."""
    if name is None:
        raise TeacherMismatch(f"--algo {algo} scores the student's tokens under a teacher: give --teacher MODEL (a "
                              "folder, hub id or a name `agentrl models` fetches) with the student's tokenizer")
    teacher = load_teacher(name, device=device)
    check_same_tokenizer(student.tokenizer, teacher.tokenizer, student_name, str(name))
    return teacher
