"""The wording of the real task's word problems: the themes a problem is drawn from (`people`, `shop`, `savings`,
`shopping`), each with its slot fillers (names, relatives, objects, shop items), the question's sentences per
operation and the reference solution's sentence per operation, written the way SmolLM2-135M-Instruct writes a step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NAMES = (
    ("Jack", "he"), ("Mia", "she"), ("Liam", "he"), ("Emma", "she"), ("Noah", "he"), ("Olivia", "she"),
    ("Ethan", "he"), ("Ava", "she"), ("Lucas", "he"), ("Sophia", "she"), ("Mason", "he"), ("Isabella", "she"),
    ("Leo", "he"), ("Chloe", "she"), ("Ben", "he"), ("Lily", "she"), ("Sam", "he"), ("Grace", "she"),
    ("Omar", "he"), ("Zoe", "she"),
)  # fmt: skip
RELATIVES = ("sister", "brother", "friend", "cousin", "neighbor", "teacher")
OBJECTS = ("stickers", "marbles", "apples", "cards", "stamps", "shells", "pencils", "beads", "crayons", "balloons")
SHOP_ITEMS = (
    ("bakery", "cookies"), ("bakery", "muffins"), ("toy store", "toy cars"), ("library", "books"),
    ("farm", "eggs"), ("flower shop", "roses"), ("school", "notebooks"), ("fruit stand", "oranges"),
)  # fmt: skip
GOODS = ("cups of lemonade", "bracelets", "drawings", "bags of cookies", "plants", "candles")
THINGS = ("a book", "a kite", "a hat", "lunch", "a game", "a ball", "a toy", "a scarf")
JOBS = ("for helping a neighbor", "for walking a dog", "for washing a car", "for mowing the lawn")


@dataclass(frozen=True)
class Theme:
    """A family of problems: slot fillers, the question's sentences per operation (variants) and the solution's
    sentence per operation. `last_only`: operations that change what is counted, drawn only as the last step, with
    the question that then asks for them."""

    name: str
    start: str  # the question's first sentence when the first step is not `start_mul`
    start_mul: tuple[str, str]  # (question sentence, solution sentence): the first step as a product
    ops: dict[str, tuple[tuple[str, ...], str]]
    question: str
    last_only: dict[str, str] = field(default_factory=dict)

    def slots(self, rng: random.Random) -> dict[str, str]:
        name, pron = rng.choice(NAMES)
        shop, item = rng.choice(SHOP_ITEMS)
        poss, him, self_ = ("his", "him", "himself") if pron == "he" else ("her", "her", "herself")
        return {
            "name": name, "pron": pron, "Pron": pron.capitalize(), "poss": poss, "Poss": poss.capitalize(),
            "him": him, "self": self_, "rel": rng.choice(RELATIVES), "obj": rng.choice(OBJECTS), "shop": shop, "item": item,
            "goods": rng.choice(GOODS), "thing": rng.choice(THINGS), "job": rng.choice(JOBS),
        }  # fmt: skip


THEMES = (
    Theme(
        "people",
        "{name} has {v} {obj}.",
        ("{name} buys {a} packs of {obj} with {b} {obj} in each pack.", "{name} has {a} * {b} = {c} {obj}."),
        {
            "+": (
                (
                    "{Pron} finds {b} more {obj}.",
                    "{Pron} gets {b} {obj} from {poss} {rel}.",
                    "{Pron} buys {b} more {obj}.",
                ),
                "{name} has {a} + {b} = {c} {obj}.",
            ),
            "-": (
                ("{Pron} gives {b} {obj} to {poss} {rel}.", "{Pron} loses {b} {obj}.", "{Pron} gives away {b} {obj}."),
                "{name} has {a} - {b} = {c} {obj} left.",
            ),
            "*": (("{Pron} trades each of {poss} {obj} for {b} new ones.",), "{name} has {a} * {b} = {c} {obj}."),
            "/": (
                ("{Pron} puts {poss} {obj} into {b} equal piles and keeps one pile.",),
                "{name} keeps {a} / {b} = {c} {obj}.",
            ),
        },
        "How many {obj} does {name} have now?",
    ),
    Theme(
        "shop",
        "The {shop} has {v} {item}.",
        ("The {shop} gets {a} boxes of {item} with {b} {item} in each box.", "The {shop} has {a} * {b} = {c} {item}."),
        {
            "+": (
                ("The {shop} gets {b} more {item}.", "A delivery brings {b} more {item} to the {shop}."),
                "The {shop} has {a} + {b} = {c} {item}.",
            ),
            "-": (
                ("The {shop} sells {b} {item}.", "Customers buy {b} {item}."),
                "The {shop} has {a} - {b} = {c} {item} left.",
            ),
            "*": (
                ("By the end of the week the {shop} has {b} times as many {item} as that.",),
                "The {shop} has {a} * {b} = {c} {item}.",
            ),
            "/": (("The {shop} puts the {item} equally on {b} shelves.",), "Each shelf has {a} / {b} = {c} {item}."),
        },
        "How many {item} does the {shop} have now?",
        {"/": "How many {item} are on each shelf?"},
    ),
    Theme(
        "savings",
        "{name} has {v} dollars.",
        ("{name} sells {a} {goods} for {b} dollars each.", "{name} earns {a} * {b} = {c} dollars."),
        {
            "+": (
                ("{Pron} earns {b} dollars {job}.", "{Poss} {rel} gives {him} {b} dollars."),
                "{name} has {a} + {b} = {c} dollars.",
            ),
            "-": (
                ("{Pron} spends {b} dollars on {thing}.", "{Pron} pays {b} dollars for {thing}."),
                "{name} has {a} - {b} = {c} dollars left.",
            ),
            "*": (
                ("By the end of the year {poss} savings grow to {b} times that amount.",),
                "{name} has {a} * {b} = {c} dollars.",
            ),
            "/": (
                ("{Pron} shares the money equally among {b} people, including {self}.",),
                "Each person gets {a} / {b} = {c} dollars.",
            ),
        },
        "How many dollars does {name} have now?",
        {"/": "How many dollars does each person get?"},
    ),
    Theme(
        "shopping",
        "{name} buys {thing} for {v} dollars.",
        ("{name} buys {a} {goods} that cost {b} dollars each.", "The {goods} cost {a} * {b} = {c} dollars."),
        {
            "+": (
                ("{Pron} also buys {thing} for {b} dollars.", "{Pron} pays {b} dollars more for delivery."),
                "{name} spends {a} + {b} = {c} dollars.",
            ),
            "-": (
                ("{Pron} uses a coupon for {b} dollars off.", "The shop gives {him} {b} dollars off."),
                "{name} pays {a} - {b} = {c} dollars.",
            ),
            "*": (
                ("{Pron} orders the same again, so {pron} pays for {b} orders in all.",),
                "{name} pays {a} * {b} = {c} dollars.",
            ),
            "/": (
                ("{Pron} splits the bill equally among {b} people, including {self}.",),
                "Each person pays {a} / {b} = {c} dollars.",
            ),
        },
        "How many dollars does {name} pay in all?",
        {"/": "How many dollars does each person pay?"},
    ),
)
