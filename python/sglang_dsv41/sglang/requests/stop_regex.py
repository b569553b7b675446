"""Which `stop_regex` patterns the server accepts.

SGLang matches each stop regex with Python's backtracking `re.search` over the request's output tail,
inside the scheduler loop, on every decode step (`Req._check_str_based_finish`; the tail is the whole
output when the pattern has no length bound). A pattern that backtracks super-linearly therefore stalls
every request on the server, not only its own: `(a|aa)*b` over 40 forced `a` tokens kept the scheduler
at 100 % CPU for minutes and `/health` timed out. A pattern that does not parse escaped SGLang's
`normalize` as `re.error` (a 500).

The rule is structural and conservative (no time limit can be put on SGLang's `re.search`):
- at most one variable-length repeat (`*`, `+`, `?`, `{m,n}` with m != n) in the whole pattern, so no
  two repeats compete for the same characters (`a*a*a*x` is cubic);
- no variable-length repeat and no alternation inside any repeat (`(a|aa)*` and `(a+){30}` are
  exponential);
- no backreference (`(a+)\\1`).
A pattern that matches the empty string (`""`, `a*`) is refused too: it matches every output at once,
so the answer would always be empty. Literals, classes, anchors, fixed counts (`a{3}`), top-level alternation (`foo|bar`) and one repeat
(`\\n\\n+`, `</?answer>`, `[0-9]+\\.`) pass. A single repeat keeps each search at most quadratic in the
tail, which is SGLang's own cost for any unbounded pattern.
"""

from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _constants as _c, _parser as _p
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())
_BACKREFS = {_c.GROUPREF, _c.GROUPREF_EXISTS}


def _children(op, av) -> list:
    """The sub-patterns of one parsed node."""
    if op in _REPEATS:
        return [av[2]]
    if op == _c.SUBPATTERN:
        return [av[-1]]
    if op == _c.BRANCH:
        return list(av[1])
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        return [av[1]]
    if op == getattr(_c, "ATOMIC_GROUP", None):
        return [av]
    return []


def _walk(pattern, in_repeat: bool, counts: dict) -> str | None:
    for op, av in pattern:
        if op in _BACKREFS:
            return "backreferences are not accepted"
        if op == _c.BRANCH and in_repeat:
            return "an alternation inside a repeat can backtrack exponentially"
        variable = op in _REPEATS and av[0] != av[1]
        if variable:
            counts["variable"] += 1
            if counts["variable"] > 1:
                return "at most one variable-length repeat (*, +, ?, {m,n}) is accepted"
            if in_repeat:
                return "a variable-length repeat inside a repeat can backtrack exponentially"
        repeats = op in _REPEATS and av[1] != 1
        for child in _children(op, av):
            err = _walk(child, in_repeat or repeats, counts)
            if err:
                return err
    return None


def pattern_error(pattern: str, field: str) -> str | None:
    """None when `pattern` parses and is safe to search on the scheduler's hot path; else the reason."""
    try:
        parsed = _p.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        return f"{field}: not a valid regular expression ({e})"[:300]
    why = _walk(parsed, False, {"variable": 0})
    if why is None and re.match(pattern, ""):
        return (f"{field}: the pattern matches the empty string, so every answer would stop before its first "
                "token (SGLang searches the output tail and stops at the first match)")
    if why:
        return (f"{field}: {why}; the server matches stop patterns with a backtracking matcher on every decode "
                f"step, so such a pattern could stall all requests")
    return None
