"""Templates that wrap one or two encoded sequences with special tokens.

A template is a list of items, each ``$A`` / ``$B`` (the sequences) or a special token, with
the segment (token type) id its tokens get. The presets (type ids: 0 up to and including the
token after ``A``, 1 after):

- ``none``: ``A``; pair ``A B``
- ``bert``: ``[CLS] A [SEP]``; pair ``[CLS] A [SEP] B [SEP]``
- ``gpt``: ``[START] A [EXTRACT]``; pair ``[START] A [DELIM] B [EXTRACT]``
- ``bos_eos``: ``<s> A </s>``; pair ``<s> A </s> B </s>`` (either token may be unset)

``bert``: Devlin et al. 2019, fig. 2. ``gpt``: Radford et al. 2018, fig. 1 (input
transformations for fine-tuning). The same template is saved to and read from Hugging Face's
``TemplateProcessing`` post-processor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PRESETS = ("none", "bert", "gpt", "bos_eos")

Item = tuple[str, int]  # ("$A" | "$B" | special token, type id)


@dataclass(frozen=True)
class Template:
    """How to lay out a single sequence and a pair.

    Attributes:
        single: items for one sequence; must contain ``$A`` once.
        pair: items for two sequences; must contain ``$A`` and ``$B`` once each.
        name: the preset it came from, or ``"custom"``.
    """

    single: tuple[Item, ...]
    pair: tuple[Item, ...]
    name: str = "custom"

    def __post_init__(self) -> None:
        if [t for t, _ in self.single].count("$A") != 1 or "$B" in [t for t, _ in self.single]:
            raise ValueError(f"template: single must hold $A once and no $B, got {self.single!r}")
        pair_names = [t for t, _ in self.pair]
        if pair_names.count("$A") != 1 or pair_names.count("$B") != 1:
            raise ValueError(f"template: pair must hold $A and $B once each, got {self.pair!r}")

    @classmethod
    def preset(cls, name: str, roles: dict[str, str]) -> "Template":
        """Build a preset from the tokens playing each role.

        Raises:
            ValueError: unknown ``name``, or a role the preset needs is not set.
        """
        def need(*wanted: str) -> list[str]:
            missing = [r for r in wanted if r not in roles]
            if missing:
                raise ValueError(
                    f"template: {name!r} needs special tokens for the roles {', '.join(missing)}; "
                    "add them with add_special_tokens(...) (e.g. '[CLS]', '[SEP]', '[START]')"
                )
            return [roles[r] for r in wanted]

        if name == "none":
            return cls((("$A", 0),), (("$A", 0), ("$B", 1)), "none")
        if name == "bert":
            c, s = need("cls", "sep")
            return cls(((c, 0), ("$A", 0), (s, 0)), ((c, 0), ("$A", 0), (s, 0), ("$B", 1), (s, 1)), "bert")
        if name == "gpt":
            st, d, e = need("start", "delim", "extract")
            return cls(((st, 0), ("$A", 0), (e, 0)), ((st, 0), ("$A", 0), (d, 0), ("$B", 1), (e, 1)), "gpt")
        if name == "bos_eos":
            bos, eos = roles.get("bos"), roles.get("eos")
            if bos is None and eos is None:
                need("bos", "eos")
            head = ((bos, 0),) if bos else ()
            tail0, tail1 = (((eos, 0),), ((eos, 1),)) if eos else ((), ())
            return cls(head + (("$A", 0),) + tail0, head + (("$A", 0),) + tail0 + (("$B", 1),) + tail1, "bos_eos")
        raise ValueError(f"template: unknown preset {name!r}; choose one of {', '.join(PRESETS)}")

    @property
    def special_tokens(self) -> list[str]:
        """The special tokens the template inserts."""
        return [t for t, _ in (*self.single, *self.pair) if t not in ("$A", "$B")]

    def num_added(self, pair: bool) -> int:
        """How many special tokens wrap a single sequence (or a pair)."""
        return len(self.pair if pair else self.single) - (2 if pair else 1)

    def apply(
        self, a: list[int], b: list[int] | None, token_to_id: Callable[[str], int]
    ) -> tuple[list[int], list[int]]:
        """Lay out ``a`` (and ``b``): returns ``(input_ids, token_type_ids)``."""
        ids: list[int] = []
        types: list[int] = []
        for name, type_id in self.single if b is None else self.pair:
            part = a if name == "$A" else b if name == "$B" else [token_to_id(name)]
            ids.extend(part)
            types.extend([type_id] * len(part))
        return ids, types

    def to_hf(self, token_to_id: Callable[[str], int]) -> dict[str, Any]:
        """Hugging Face ``TemplateProcessing`` block."""
        def items(seq: tuple[Item, ...]) -> list[dict[str, Any]]:
            return [
                {"Sequence": {"id": name[1], "type_id": t}} if name in ("$A", "$B")
                else {"SpecialToken": {"id": name, "type_id": t}}
                for name, t in seq
            ]

        specials = {tok: {"id": tok, "ids": [token_to_id(tok)], "tokens": [tok]} for tok in self.special_tokens}
        return {"type": "TemplateProcessing", "single": items(self.single), "pair": items(self.pair),
                "special_tokens": specials}

    @classmethod
    def from_hf(cls, spec: dict[str, Any], roles: dict[str, str]) -> "Template":
        """Read a ``TemplateProcessing``, ``BertProcessing`` or ``RobertaProcessing`` block.

        Raises:
            ValueError: for other post-processor types.
        """
        kind = spec.get("type")
        if kind == "BertProcessing":
            c, s = spec["cls"][0], spec["sep"][0]
            return cls(((c, 0), ("$A", 0), (s, 0)), ((c, 0), ("$A", 0), (s, 0), ("$B", 1), (s, 1)), "bert")
        if kind == "RobertaProcessing":
            c, s = spec["cls"][0], spec["sep"][0]
            return cls(((c, 0), ("$A", 0), (s, 0)), ((c, 0), ("$A", 0), (s, 0), (s, 0), ("$B", 0), (s, 0)))
        if kind != "TemplateProcessing":
            raise ValueError(
                f"post_processor: unsupported type {kind!r}; attnlab reads TemplateProcessing, "
                "BertProcessing, RobertaProcessing and ByteLevel"
            )
        aliases = {k: v.get("tokens", [k]) for k, v in spec.get("special_tokens", {}).items()}

        def read(items: list[dict[str, Any]]) -> tuple[Item, ...]:
            out: list[Item] = []
            for item in items:
                if "Sequence" in item:
                    out.append(("$" + item["Sequence"]["id"], item["Sequence"].get("type_id", 0)))
                else:
                    tok = item["SpecialToken"]
                    out.extend((t, tok.get("type_id", 0)) for t in aliases.get(tok["id"], [tok["id"]]))
            return tuple(out)

        template = cls(read(spec["single"]), read(spec["pair"]))
        for name in PRESETS:  # give it its preset name back when it is one
            try:
                if Template.preset(name, roles) == Template(template.single, template.pair, name):
                    return Template(template.single, template.pair, name)
            except ValueError:
                continue
        return template
