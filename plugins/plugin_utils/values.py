# Apache License 2.0 (see LICENSE)
"""Small value helpers shared by the controller-side planners (one place; no Ansible imports)."""
from __future__ import annotations

import re

__all__ = ["compress_ints", "is_int", "as_int", "as_float", "as_bool", "edit_distance"]


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
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
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
