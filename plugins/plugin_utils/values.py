# Apache License 2.0 (see LICENSE)
"""Small value helpers shared by the controller-side planners (one place; no Ansible imports)."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["compress_ints", "is_int", "as_int", "as_float", "as_bool", "edit_distance", "suggest", "plain", "kind",
           "shown", "scrub", "LOOPBACK"]

#: The addresses that only the host itself reaches (a bind address, a worker address).
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def compress_ints(values) -> str:
    """``[0, 1, 2, 3, 64, 65]`` -> ``"0-3,64-65"`` (the form systemd's CPUAffinity= and taskset take)."""
    nums = sorted(set(int(v) for v in values))
    parts = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value):
    """An int from an int or a string of digits; None when it is neither."""
    if is_int(value):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[ \t\n\r\f\v]*-?[0-9]+[ \t\n\r\f\v]*", value):
        return int(value)  # ASCII digits and blanks only: int() refuses \x1f, and reads '٣' as 3
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_float(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("yes", "true", "on", "1", "y"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("no", "false", "off", "0", "n"):
        return False
    if is_int(value) and value in (0, 1):
        return bool(value)
    return None


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance, for "did you mean" suggestions."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def suggest(key, known) -> str:
    """"; did you mean 'k'?" for a misspelt ``key`` (dashes for underscores, at most two edits from a known key
    ``k``, or ``k`` with its unit left off); "" when nothing known is close. The one suggestion of every refusal
    of an unknown key or name, at any depth."""
    if not isinstance(key, str):
        return ""
    if key.replace("-", "_") in known:
        return f"; did you mean '{key.replace('-', '_')}' (underscores, not dashes)?"
    close = sorted(known, key=lambda k: edit_distance(k, key))
    if close and edit_distance(close[0], key) <= 2:
        return f"; did you mean '{close[0]}'?"
    longer = [k for k in known if k.startswith(key + "_")]  # a unit left off: reserve -> reserve_mib
    return f"; did you mean '{longer[0]}'?" if len(longer) == 1 else ""


def plain(value, _depth=0):
    """The same data as Python's own types: dict, list, str, int, float, bool, None.

    Ansible hands filters its tagged subclasses (``_AnsibleTaggedStr``, ``_AnsibleTaggedList``, ...); their class
    names would leak into messages (``type(x).__name__``, Python's own error texts). Anything else (a date, a
    set) becomes its string form; nesting deeper than 100 levels is cut off (None).
    """
    if _depth > 100:
        return None
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {plain(k, _depth + 1): plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, _depth + 1) for v in value]
    return str(value)


def kind(value) -> str:
    """What a value is, in the words of a YAML inventory: 'a string', 'a list', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a dict"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a value of another kind"


def shown(value, limit=80) -> str:
    """A value as a message quotes it (Python literal of the plain value), shortened to about ``limit`` characters."""
    value = plain(value)
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + " ..."


_TAGGED = re.compile(r"_AnsibleTagged([A-Za-z]+)|_AnsibleLazyTemplate([A-Za-z]+)")


def scrub(text) -> str:
    """A message without Ansible's internal class names (``_AnsibleTaggedInt`` -> ``int``)."""
    return _TAGGED.sub(lambda m: (m.group(1) or m.group(2)).lower(), str(text))
