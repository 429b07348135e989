"""The agents the demo runs: the research assistant (its tools, task, reviewer and scripted
replies) and the approver, whose tool waits for an editor's signal.

Every process of the demo builds the same agents from this module. The scripted replies
depend only on the transcript a request carries, so a process that resumes a session
is answered exactly as the killed one would have been.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from loomflow.agent import Agent, SessionState, Tuning, wait_for_signal
from loomflow.models.base import Model
from loomflow.models.scripted import Reply
from loomflow.runtime import Runtime
from loomflow.schemas import Message, Role, ToolCall

__all__ = [
    "APPROACH_PROMPTS",
    "APPROVAL_SIGNAL",
    "APPROVAL_TASK",
    "APPROVER",
    "FORK_PROMPT",
    "MAIN_TURNS",
    "REFINEMENTS",
    "RESEARCHER",
    "TASK",
    "TOOLS",
    "approver_reply",
    "build_agent",
    "build_approver",
    "editor_answer",
    "scripted_reply",
]

# -- the research assistant's tools -------------------------------------------------------

FACTS: dict[str, str] = {
    "mars": (
        "Mars: mean radius 3,389.5 km; surface gravity 3.72 m/s^2; a solar day (sol) lasts "
        "24 h 39 min; two small moons, Phobos and Deimos."
    ),
    "earth": "Earth: mean radius 6,371 km; surface gravity 9.81 m/s^2; a solar day lasts 24 h.",
    "moon": (
        "The Moon: mean radius 1,737.4 km; surface gravity 1.62 m/s^2; a solar day lasts "
        "about 29.5 Earth days."
    ),
    "olympus mons": (
        "Olympus Mons, on Mars: about 21.9 km high, some 2.5 times the height of Mount "
        "Everest (8.85 km)."
    ),
}


def lookup_fact(topic: str) -> str:
    """Look up reference facts about a planet, moon or landmark.

    Args:
        topic: What to look up, e.g. "mars", "earth", "moon" or "olympus mons".
    """
    key = topic.strip().lower()
    if key not in FACTS:
        raise LookupError(f"no entry for {topic!r}; known topics: {', '.join(sorted(FACTS))}")
    return FACTS[key]


def word_count(text: str) -> int:
    """Count the words of a draft, to check it against a length limit.

    Args:
        text: The draft to count.
    """
    return len(text.split())


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponents above 64 are not supported")  # keeps the tool instant
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).

    Args:
        expression: The expression, e.g. "3389.5 / 6371".
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _evaluate(tree)
    if not math.isfinite(value):
        raise ValueError(f"{expression!r} has no finite value")
    return round(value, 4)


TOOLS: tuple[Callable[..., Any], ...] = (lookup_fact, calculate, word_count)

# -- the task, the reviewer stop hook and the scripted replies ----------------------------

INSTRUCTIONS = (
    "You are a careful research assistant writing for a school science newsletter. Use "
    "lookup_fact for every fact, calculate for every number you derive and word_count to "
    "check length; never guess figures. End every pass with the full current draft."
)
TASK = (
    "Write a short briefing on Mars for the newsletter: how big it is next to Earth, how "
    "strong its gravity is and how long its day is."
)
FORK_PROMPT = "try a different approach from here"
REFINEMENTS: tuple[str, ...] = (
    "Reviewer: the draft estimates where it could be exact. Work the ratios out with the "
    "calculator and use the exact figures.",
    "Reviewer: the newsletter column holds at most 50 words. Count the words and tighten "
    "the draft to fit.",
    "Reviewer: give readers one number they can feel: what would a 40 kg student weigh on "
    "Mars, in Earth kilograms? Check the length again.",
)
#: A task prompt or the fork prompt starts an approach, which the reviewer reviews anew.
APPROACH_PROMPTS = (TASK, FORK_PROMPT)


def _stage(messages: Sequence[Message]) -> tuple[bool, int, int]:
    """(forked?, reviews asked since the approach began, model replies since the last ask).

    Continuation nudges are skipped on purpose: a reply resumed after a crash must be the
    one the interrupted process would have received.
    """
    forked, reviews, replies = False, 0, 0
    for message in messages:
        if message.role is Role.USER and message.content in APPROACH_PROMPTS:
            forked, reviews, replies = message.content == FORK_PROMPT, 0, 0
        elif message.role is Role.USER and message.content in REFINEMENTS:
            reviews, replies = reviews + 1, 0
        elif message.role is Role.ASSISTANT:
            replies += 1
    return forked, reviews, replies


def reviewer(state: SessionState) -> str | None:
    """Stop hook: send each draft back for the next review point until all are addressed."""
    _, reviews, _ = _stage(state.messages)
    return REFINEMENTS[reviews] if reviews < len(REFINEMENTS) else None


def _calls(*calls: tuple[str, dict[str, Any]], text: str = "") -> Message:
    # Ids are left empty: ScriptedModel numbers them per turn, as an API would assign them.
    return Message.assistant(
        text, tool_calls=[ToolCall(id="", name=name, arguments=args) for name, args in calls]
    )


def _pct(expression: str) -> str:
    return f"{calculate(expression) * 100:.0f}%"


DRAFT_1 = (
    "Mars is roughly half the size of Earth, its gravity is about a third of ours, and a day "
    "there lasts a little longer than 24 hours. Two small moons, Phobos and Deimos, circle it."
)
DRAFT_2 = (
    f"Mars has a radius of 3,389.5 km, {_pct('3389.5 / 6371')} of Earth's, and its surface "
    f"gravity of 3.72 m/s^2 is {_pct('3.72 / 9.81')} of what we feel at home. A Martian day, "
    "called a sol, lasts 24 hours 39 minutes, so the clock barely changes, but everything "
    "weighs far less. Two small moons, Phobos and Deimos, circle the planet."
)
DRAFT_3 = (
    f"Mars is {_pct('3389.5 / 6371')} as wide as Earth and its gravity is "
    f"{_pct('3.72 / 9.81')} of ours. A Martian day, a sol, lasts 24 hours 39 minutes. Two "
    "small moons, Phobos and Deimos, circle it."
)
STUDENT_ON_MARS = f"{calculate('40 * 3.72 / 9.81'):.1f}"
FINAL = (
    f"Mars is {_pct('3389.5 / 6371')} as wide as Earth and its gravity is "
    f"{_pct('3.72 / 9.81')} of ours: a 40 kg student would weigh just {STUDENT_ON_MARS} kg "
    "there. A Martian day, a sol, lasts 24 hours 39 minutes. Phobos and Deimos are its moons."
)
FORK_DRAFT = (
    f"Picture the Moon you see at night: Mars is {calculate('3389.5 / 1737.4'):.1f} times as "
    f"wide, and its gravity is {calculate('3.72 / 1.62'):.1f} times the Moon's, yet still only "
    f"{_pct('3.72 / 9.81')} of Earth's. A day on Mars lasts 24 hours 39 minutes, while a lunar "
    "day drags on for about 29.5 Earth days."
)
FORK_FINAL = (
    f"Mars is {calculate('3389.5 / 1737.4'):.1f} times as wide as our Moon, with "
    f"{calculate('3.72 / 1.62'):.1f} times its gravity, yet a 40 kg student would weigh only "
    f"{STUDENT_ON_MARS} kg there. A Martian day lasts 24 hours 39 minutes; a lunar day, 29.5 "
    "Earth days."
)

#: Replies per approach (main, fork) and per review round, in the order they are asked for.
MAIN_SCRIPT: tuple[tuple[Reply, ...], ...] = (
    (
        _calls(
            ("lookup_fact", {"topic": "mars"}),
            ("lookup_fact", {"topic": "earth"}),
            text="I'll start from the reference facts for both planets.",
        ),
        DRAFT_1,
    ),
    (
        _calls(("calculate", {"expression": "3389.5 / 6371"})),
        _calls(("calculate", {"expression": "3.72 / 9.81"})),
        f"With exact ratios:\n\n{DRAFT_2}",
    ),
    (
        _calls(("word_count", {"text": DRAFT_2})),
        f"The draft had {word_count(DRAFT_2)} words; tightened:\n\n{DRAFT_3}",
    ),
    (
        _calls(("calculate", {"expression": "40 * 3.72 / 9.81"})),
        _calls(("word_count", {"text": FINAL})),
        f"Final briefing ({word_count(FINAL)} words):\n\n{FINAL}",
    ),
)
FORK_SCRIPT: tuple[tuple[Reply, ...], ...] = (
    (
        _calls(
            ("lookup_fact", {"topic": "moon"}),
            text="Different angle: anchor Mars on the Moon, which every reader has seen.",
        ),
        _calls(
            ("calculate", {"expression": "3389.5 / 1737.4"}),
            ("calculate", {"expression": "3.72 / 1.62"}),
        ),
        FORK_DRAFT,
    ),
    (f"Every ratio above already comes from the calculator:\n\n{FORK_DRAFT}",),
    (
        _calls(("word_count", {"text": FORK_DRAFT})),
        f"The draft had {word_count(FORK_DRAFT)} words; tightened:\n\n{FORK_FINAL}",
    ),
    (f"The 40 kg student is already in, and it fits the column:\n\n{FORK_FINAL}",),
)
AFTER_INTERRUPTION = (
    "Picking up after the interruption: the draft above is complete for this review point."
)
#: Model calls of the worker's run when nothing interrupts it.
MAIN_TURNS = sum(len(replies) for replies in MAIN_SCRIPT)


def scripted_reply(messages: Sequence[Message]) -> Reply:
    """The next reply, chosen from the transcript alone so any process picks the same one."""
    forked, reviews, replies = _stage(messages)
    script = FORK_SCRIPT if forked else MAIN_SCRIPT
    round_ = script[min(reviews, len(script) - 1)]
    return round_[replies] if replies < len(round_) else AFTER_INTERRUPTION


#: Agent names: what a run's run.started records, and what a worker must host to resume it.
RESEARCHER = "researcher"
APPROVER = "approver"


def build_agent(runtime: Runtime, model: Model) -> Agent:
    """The assistant on ``runtime``: one checkpoint per pass, so the fork has some to pick."""
    return Agent(
        INSTRUCTIONS,
        model=model,
        runtime=runtime,
        tuning=Tuning(checkpoint=True, stop_hooks=[reviewer]),
        tools=TOOLS,
        name=RESEARCHER,
    )


# -- the approver: a run that waits for a person ------------------------------------------

APPROVAL_SIGNAL = "approve"
APPROVAL_TASK = "Publish the Mars briefing in Friday's newsletter, once the editor approves it."
#: An hour: long enough that only the editor's answer, never the timeout, ends the demo's wait.
APPROVAL_TIMEOUT_S = 3600.0


def editor_answer(answer: object) -> str:
    """What ``ask_editor`` returns for the editor's signal payload (the demo checks it)."""
    return f"the editor answered {json.dumps(answer, sort_keys=True)}"


async def ask_editor(item: str) -> str:
    """Ask the editor to approve publishing an item; returns their answer.

    Args:
        item: What should be published.
    """
    # The run ends here until the editor sends the signal; a worker resumes it then, and
    # this call returns the signal's payload as if it had never stopped.
    return editor_answer(await wait_for_signal(APPROVAL_SIGNAL, timeout=APPROVAL_TIMEOUT_S))


def approver_reply(messages: Sequence[Message]) -> Reply:
    """The approver's script: ask the editor, then act on the answer the tool returned."""
    last = messages[-1] if messages else None
    if last is None or last.role is not Role.TOOL:
        return _calls(
            ("ask_editor", {"item": "the Mars briefing"}),
            text="The briefing needs the editor's approval before it goes out.",
        )
    if not last.is_error and '"ok": true' in last.content:
        return "Approved by the editor: the Mars briefing goes out in Friday's newsletter."
    return "The editor did not approve it, so the Mars briefing stays unpublished."


def build_approver(runtime: Runtime, model: Model) -> Agent:
    """The approver on ``runtime``: its one tool waits for the editor's ``approve`` signal."""
    return Agent(
        "You publish newsletter items, and only with the editor's approval.",
        model=model,
        runtime=runtime,
        tuning=Tuning(checkpoint=True),
        tools=[ask_editor],
        name=APPROVER,
    )
