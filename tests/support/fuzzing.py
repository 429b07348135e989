"""What the fuzzing tests of tests/faults share: hypothesis settings sized by ``trials``,
and strategies for ids and for values JSON can or cannot hold."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from loomflow.schemas.ids import MAX_ID_LENGTH

#: what an id may hold after its first character (see loomflow/schemas/ids.py)
ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@+=-"
_FIRST = ID_CHARS[:62]


def fuzz_settings(examples: int) -> settings:
    """``examples`` examples (a count from ``trials``), no deadline (a Kafka round trip
    or a SQLite commit is not a slow test), and nothing written into the tree."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def valid_ids(max_size: int = MAX_ID_LENGTH) -> st.SearchStrategy[str]:
    """Ids every store must accept and give back unchanged."""
    return st.builds(
        lambda first, rest: first + rest,
        st.sampled_from(_FIRST),
        st.text(alphabet=ID_CHARS, max_size=max_size - 1),
    )


#: characters that look harmless and are not in an id: whitespace, separators, quotes,
#: NUL, look-alikes from other scripts, lone surrogates
_TRAPS = [" ", "\t", "\n", "\r", "\x00", "/", "\\", "'", '"', "%", "#", "?", "*", "é", "\uff41",
          "\u0661", "\u200b", "\ufeff", "\ud800", "\udcff", "\U0001f600"]  # fmt: skip


def invalid_ids() -> st.SearchStrategy[Any]:
    """Values no store may accept as a session, user or checkpoint id (None aside: it
    means "no user" or "a new session" where an id is optional)."""
    foreign = st.one_of(st.sampled_from(_TRAPS), st.characters(exclude_characters=ID_CHARS))
    inserted = st.builds(
        lambda head, char, tail, where: (head + tail)[:where] + char + (head + tail)[where:],
        valid_ids(60),
        foreign,
        st.text(alphabet=ID_CHARS, max_size=20),
        st.integers(0, 80),
    )
    return st.one_of(
        st.just(""),
        inserted,
        st.builds(lambda lead, rest: lead + rest, st.sampled_from("._:@+=-"), valid_ids(40)),
        st.builds(lambda i: i + "\n", valid_ids(40)),  # `$` in a regex matches before it
        st.builds(lambda i: " " + i, valid_ids(40)),
        st.text(alphabet=ID_CHARS, min_size=MAX_ID_LENGTH + 1, max_size=MAX_ID_LENGTH + 40).map(
            lambda s: "a" + s[1:]
        ),
        st.integers(),
        st.floats(),
        st.booleans(),
        st.binary(max_size=20),
        st.lists(valid_ids(10), max_size=2),
        st.tuples(valid_ids(10)),
    )


# -- values -------------------------------------------------------------------------------

_INT64 = (-(2**63), 2**64 - 1)  # what orjson writes; a wider int is not JSON a store keeps


def json_values() -> st.SearchStrategy[Any]:
    """Values JSON holds: what a tool, a signal or run metadata may carry unchanged."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(*_INT64),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),  # hypothesis leaves out lone surrogates: these are all UTF-8
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def any_values() -> st.SearchStrategy[Any]:
    """JSON values, and values nested among them that JSON cannot hold: NaN, infinities,
    wide ints, bytes, sets, objects, keys that are not strings, lone surrogates."""
    odd = st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.integers(min_value=_INT64[1] + 1),
        st.integers(max_value=_INT64[0] - 1),
        st.binary(max_size=8),
        st.frozensets(st.integers(0, 9), max_size=3),
        st.builds(object),
        st.sampled_from(["\ud800", "ok \udcff", "\udfff tail"]),
    )
    leaves = st.one_of(json_values(), odd)
    keys = st.one_of(st.text(max_size=8), st.integers(0, 9), st.sampled_from(["\ud800"]))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)
        ),
        max_leaves=10,
    )


def json_can_hold(value: Any) -> bool:
    """Whether ``value`` is JSON as RFC 8259 has it, written by this project's codec
    (orjson): no NaN or infinities, ints within 64 bits, str keys, valid UTF-8 text.
    Written apart from the codec, as the oracle the fuzzing compares it with."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, list | tuple):
        return all(json_can_hold(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _utf8(k) and json_can_hold(v) for k, v in value.items())
    return False


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
