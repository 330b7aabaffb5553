"""Few-shot prompts for decoder language models (Brown et al. 2020, "Language Models are
Few-Shot Learners", https://arxiv.org/abs/2005.14165): an instruction, k solved examples and
the query, each rendered by one template, joined by a separator; the model continues after
the query's empty answer slot.

    >>> p = FewShotPrompt("Q: {input}\\nA: {output}", instruction="Add the numbers.")
    >>> print(p.build([("1+1", "2"), ("2+3", "5")], "4+4"))
    Add the numbers.
    <BLANKLINE>
    Q: 1+1
    A: 2
    <BLANKLINE>
    Q: 2+3
    A: 5
    <BLANKLINE>
    Q: 4+4
    A:
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

Example = Union[Mapping[str, Any], Sequence[Any]]


def _fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


@dataclass
class FewShotPrompt:
    """A template for k-shot prompts.

    Args:
        template: a `str.format` template with an `{input}` and an `{output}` field (other
            fields are allowed: examples then give them by name); `{output}` must come last,
            since the query is rendered up to it.
        instruction: optional text before the examples.
        example_separator: between the instruction and the rendered examples.
        input_key: the name of the input field in `template`.
        output_key: the name of the output field in `template`.
    """

    template: str = "Input: {input}\nOutput: {output}"
    instruction: str = ""
    example_separator: str = "\n\n"
    input_key: str = "input"
    output_key: str = "output"

    def __post_init__(self) -> None:
        names = _fields(self.template)
        for key in (self.input_key, self.output_key):
            if key not in names:
                raise ValueError(f"template must contain a {{{key}}} field, got {self.template!r}")
        if names[-1] != self.output_key:
            raise ValueError(f"the {{{self.output_key}}} field must be the last one in template, got {self.template!r}")

    def _values(self, example: Example, with_output: bool) -> dict[str, Any]:
        if isinstance(example, Mapping):
            values = dict(example)
        elif isinstance(example, Sequence) and not isinstance(example, str) and len(example) == 2:
            values = {self.input_key: example[0], self.output_key: example[1]}
        else:
            raise TypeError("an example must be a mapping of template fields or an (input, output) pair, "
                            f"got {type(example).__name__}")
        needed = [n for n in _fields(self.template) if with_output or n != self.output_key]
        missing = [n for n in needed if n not in values]
        if missing:
            raise ValueError(f"example {example!r} lacks the field(s) {', '.join(missing)}")
        return values

    def render(self, example: Example) -> str:
        """One solved example."""
        return self.template.format(**self._values(example, True))

    def render_query(self, query: Any) -> str:
        """The query, up to (not including) its answer; trailing spaces are dropped so that
        the model's first token carries its own leading space, as in its training text."""
        head = self.template[: self.template.rindex("{" + self.output_key + "}")]
        values = self._values(query, False) if isinstance(query, Mapping) else {self.input_key: query}
        return head.format(**values).rstrip(" ")

    def build(self, examples: Sequence[Example], query: Any, *, k: int | None = None, seed: int | None = None) -> str:
        """The prompt text: instruction, examples and the query.

        Args:
            examples: solved examples (mappings or (input, output) pairs).
            query: the input to answer (a value, or a mapping of the other fields).
            k: use k examples (all when None); with `seed`, a seeded random choice of k,
                otherwise the first k.
            seed: seed of the random choice (and order) of the examples.

        Returns:
            the prompt string.

        Raises:
            ValueError: k larger than the number of examples, or negative.
        """
        examples = list(examples)
        if k is None:
            k = len(examples)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= len(examples):
            raise ValueError(f"k must be an integer in [0, {len(examples)}] (the examples given), got {k!r}")
        chosen = random.Random(seed).sample(examples, k) if seed is not None else examples[:k]
        parts = ([self.instruction] if self.instruction else []) + [self.render(e) for e in chosen]
        parts.append(self.render_query(query))
        return self.example_separator.join(parts)
