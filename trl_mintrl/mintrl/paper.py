"""MInTRL's paper, cited in the model cards of both MInTRL trainers (TRL's `_paper`), which import it from here so
that the asynchronous trainer does not import the synchronous one."""

from __future__ import annotations

import textwrap

PAPER = {
    "title": "MInTRL: Off-policy Intervention can boost On-policy RL",
    "id": None,
    "citation": textwrap.dedent("""\
        @article{chen2026mintrl,
            title        = {{MInTRL: Off-policy Intervention can boost On-policy RL}},
            author       = {Mingyu Chen and Yefan Tao and Gerald Friedland and Xuezhou Zhang and Chris Kong},
            year         = 2026,
        }"""),
}
