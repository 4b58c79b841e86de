"""Deterministic "generic chat" text, unrelated to the arithmetic task.

The paper's generic EAGLE-3 initialization was trained on UltraChat + Magpie; with no hub
here, a seeded template grammar stands in for it. What matters for the experiment is that
the text is out of domain for the task, so a draft trained on it is weaker on math rollouts.
"""

from __future__ import annotations

import random

_SUBJECTS = [
    "the weather",
    "my garden",
    "a good book",
    "the old library",
    "our team",
    "the river",
    "this recipe",
    "the museum",
    "a quiet morning",
    "the city park",
    "my neighbor",
    "the mountain trail",
    "a long journey",
    "the new cafe",
    "the school choir",
]
_VERBS = [
    "is",
    "seems",
    "looks",
    "feels",
    "became",
    "was",
    "remains",
    "has been",
]
_ADJECTIVES = [
    "pleasant",
    "surprising",
    "calm",
    "busy",
    "wonderful",
    "strange",
    "bright",
    "gentle",
    "crowded",
    "peaceful",
    "curious",
    "lovely",
    "difficult",
    "simple",
    "famous",
]
_ASKS = [
    "Can you tell me about",
    "What do you think of",
    "Please describe",
    "Why do people like",
    "How would you explain",
]
_REPLIES = [
    "Sure. ",
    "Of course! ",
    "Good question. ",
    "Happy to help. ",
    "Well, ",
]
_CLAUSES = [
    "because the days are longer",
    "when friends visit",
    "after a little rain",
    "if you take your time",
    "during the summer",
    "while the sun sets",
    "since everyone agrees",
    "as the story goes",
]


def _sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_ADJECTIVES)}"
    if rng.random() < 0.5:
        s += f" {rng.choice(_CLAUSES)}"
    return s[0].upper() + s[1:] + "."


def dialogue(rng: random.Random) -> str:
    """One short user/assistant exchange ending with a newline."""
    ask = f"User: {rng.choice(_ASKS)} {rng.choice(_SUBJECTS)}?\n"
    body = " ".join(_sentence(rng) for _ in range(rng.randint(2, 4)))
    return ask + f"Assistant: {rng.choice(_REPLIES)}{body}\n"


def corpus(n: int, *, seed: int) -> list[str]:
    """n seed-determined dialogues."""
    rng = random.Random(seed)
    return [dialogue(rng) for _ in range(n)]
