"""Reading unit files back the way systemd does, for the vllm_service tests (not a test module)."""
from __future__ import annotations


def unit_lines(text):
    """Logical lines of a unit file: comments dropped, backslash continuations joined."""
    out, cur = [], ""
    for raw in text.splitlines():
        if not cur and (raw.startswith("#") or raw.startswith(";")):
            continue
        if raw.endswith("\\"):
            cur += raw[:-1] + " "
            continue
        cur += raw
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def directives(text):
    """{key: [values]} over all sections ([Unit], [Service], [Install])."""
    found = {}
    for line in unit_lines(text):
        if line.startswith("["):
            continue
        key, _sep, value = line.partition("=")
        found.setdefault(key, []).append(value)
    return found


def split_exec(value, dollars=True):
    """systemd's splitting of an ExecStart= (or Environment=, ``dollars=False``) value: double quotes,
    C escapes, then %% (and $$ for ExecStart=) back to one character."""
    words, cur, i, quoted, have = [], "", 0, False, False
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            cur += {"n": "\n", "t": "\t"}.get(value[i + 1], value[i + 1])
            i += 2
            have = True
            continue
        if c == '"':
            quoted = not quoted
            have = True
        elif c.isspace() and not quoted:
            if have:
                words.append(cur)
            cur, have = "", False
        else:
            cur += c
            have = True
        i += 1
    if have:
        words.append(cur)
    return [_unspecify(w, "%$" if dollars else "%") for w in words]


def _unspecify(word, chars):
    """Undo %% (specifier escape) and $$ (variable escape) left to right, as systemd does.

    A lone % would be a specifier and a lone $NAME / ${NAME} a variable that systemd replaces:
    raise, since the argument would not reach the process as written.
    """
    out, i = "", 0
    while i < len(word):
        c = word[i]
        nxt = word[i + 1] if i + 1 < len(word) else ""
        if c in chars and nxt == c:
            out += c
            i += 2
            continue
        if c == "%" and "%" in chars:
            raise ValueError("lone %% (specifier) in %r" % word)
        if c == "$" and "$" in chars and (nxt == "{" or nxt.isalpha() or nxt == "_"):
            raise ValueError("unescaped variable in %r" % word)
        out += c
        i += 1
    return out


def environment(text):
    env = {}
    for value in directives(text).get("Environment", []):
        for word in split_exec(value, dollars=False):
            k, _sep, v = word.partition("=")
            env[k] = v
    return env
