"""Griffe extension: read TRL's config docstring idiom as Google-style parameters.

TRL documents config fields as ``name (`type`, *optional*, defaults to `value`):`` under ``Parameters:``, with
``> group`` lines and blank lines between the groups, and links classes as ``[`SORTTrainer`]`` for its own doc
builder. Griffe's Google parser splits an entry at its first colon (a default such as `{"enable_thinking": False}`
breaks it) and ends the section at a blank line, so before parsing each entry becomes ``name (type):`` (the default
is shown from the signature), group and blank lines inside the section are dropped, and links become code spans.
"""

from __future__ import annotations

import re

import griffe

ENTRY = re.compile(r"^(?P<indent>\s+)(?P<name>\w+) \((?P<spec>`.*)\):\s*$")
GROUP = re.compile(r"^\s+> ")
LINK = re.compile(r"\[`~?(?:[\w]+\.)*?(?P<name>[\w]+)`\]")


def _entry_type(spec: str) -> str:
    """The type of a TRL parameter entry: the spec up to `*optional*` / `defaults to`, without backticks."""
    spec = re.split(r",\s*(?:\*optional\*|defaults to)", spec, maxsplit=1)[0]
    return spec.replace("`", "").strip()


def trl_to_google(text: str) -> str:
    lines, in_parameters = [], False
    for line in text.splitlines():
        if line.strip() == "Parameters:":
            in_parameters = True
        elif in_parameters and line.strip() and not line[0].isspace():
            in_parameters = False  # the next section or paragraph
        if in_parameters and (not line.strip() or GROUP.match(line)):
            continue
        entry = ENTRY.match(line) if in_parameters else None
        if entry:
            line = f"{entry['indent']}{entry['name']} ({_entry_type(entry['spec'])}):"
        lines.append(LINK.sub(r"`\g<name>`", line))
    return "\n".join(lines)


class TRLDocstrings(griffe.Extension):
    def on_class_instance(self, *, cls: griffe.Class, **kwargs) -> None:
        if cls.docstring is not None and "Parameters:" in cls.docstring.value:
            cls.docstring.value = trl_to_google(cls.docstring.value)
