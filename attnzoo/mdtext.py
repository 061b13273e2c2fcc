"""Untrusted text in Markdown: the one escaper of every page the package writes from a file or a plugin.

A report page puts values read from a ``report.json`` (which anyone can edit) or a plugin's registry entry (its
``paper``, ``equations``, ``extra_params``) into tables, code spans, code blocks and links. Each goes through one
of these, so no value can add raw HTML, a link, a table cell or a line:

- :func:`text`: inline text and table cells: ``& < >`` become entities (no raw HTML), ``|`` ``\\|``, backticks,
  ``[ ]`` and ``\\`` backslash-escaped (no code span, link or image starts in it), every line break a space;
  a bare ``http(s)://`` or ``www.`` address autolinks only to a host of :data:`KNOWN_HOSTS`.
- :func:`code`: an inline code span that holds the value whole, whatever backticks it contains.
- :func:`fence`: a fenced code block that holds the value whole.
- :func:`link`: a link to a relative path inside the page's folder, or to ``https``/``http`` on a known host;
  anything else is the text alone.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["KNOWN_HOSTS", "text", "code", "fence", "link"]

#: Hosts a page may link to (the papers' and the projects' own); every other address is shown as text.
KNOWN_HOSTS = frozenset({"arxiv.org", "openreview.net", "github.com", "doi.org", "pytorch.org", "onnx.ai"})

_BREAKS = re.compile(r"[\r\n\u2028\u2029\x0b\x0c]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_SPECIAL = re.compile(r"([\\`\[\]|])")
_ADDRESS = re.compile(r"(?i)\b(?:https?://|www\.)[^\s<>]*")


def _flat(value: Any) -> str:
    """``value`` as one line: line breaks a space, other control characters dropped."""
    return _CONTROL.sub("", _BREAKS.sub(" ", str(value)))


def _known(address: str) -> bool:
    host = (urlsplit(address if "://" in address else f"https://{address}").hostname or "").lower()
    return any(host == h or host.endswith(f".{h}") for h in KNOWN_HOSTS)


def text(value: Any) -> str:
    """``value`` as Markdown text that renders as itself, on one line, inside a table cell or not."""
    flat = _flat(value)
    out, last = [], 0
    for m in _ADDRESS.finditer(flat):
        out.append(_plain(flat[last : m.start()]))
        address = m.group(0)
        if _known(address) and address.lower().startswith(("https://", "http://")):
            out.append(_plain(address))  # left to autolink (escapes are read before autolinks are found)
        else:  # no autolink: the separator is an entity, which the autolinker does not read as one
            out.append(_plain(address).replace("://", "&#58;//", 1).replace("www.", "www&#46;", 1))
        last = m.end()
    out.append(_plain(flat[last:]))
    return "".join(out)


def _plain(s: str) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", s)


def code(value: Any) -> str:
    """``value`` as one inline code span: its fence is one backtick longer than its longest run of them, ``|`` is
    escaped (a table cell ends at an unescaped one even in a code span), line breaks are spaces."""
    s = _flat(value).replace("|", "\\|")
    if not s:
        return "` `"
    ticks = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    return f"{ticks}{pad}{s}{pad}{ticks}"


def fence(value: Any, info: str = "") -> list[str]:
    """``value`` (several lines) as a fenced code block's lines: the fence is longer than any run of backticks
    or tildes in it, so nothing in it closes the block early."""
    body = _CONTROL.sub("", str(value).replace("\r\n", "\n").replace("\r", "\n"))
    n = max([3, *(len(r) + 1 for r in re.findall(r"`+", body))])
    return ["`" * n + re.sub(r"[^a-z0-9-]", "", info), *body.split("\n"), "`" * n]


def link(label: Any, target: str) -> str:
    """A Markdown link to ``target``: a relative path (made of path characters only, never leaving the folder)
    or an ``http(s)`` address on a known host; anything else is the label alone (:func:`text`)."""
    shown = text(label)
    parts = urlsplit(target)
    if parts.scheme in ("https", "http") and _known(target):
        return f"[{shown}]({quote(target, safe=':/?#&=%.-_~+')})"
    if not parts.scheme and not parts.netloc and not target.startswith("/") and ".." not in target.split("/"):
        return f"[{shown}]({quote(target, safe='/.-_~')})"
    return shown
