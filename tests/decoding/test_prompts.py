"""The few-shot prompt builder."""

import pytest

from attnlab.decoding.prompts import FewShotPrompt


def test_build_joins_instruction_examples_and_query():
    p = FewShotPrompt("English: {input}\nFrench: {output}", instruction="Translate.", example_separator="\n###\n")
    text = p.build([("cat", "chat"), {"input": "dog", "output": "chien"}], "bird")
    assert text == ("Translate.\n###\nEnglish: cat\nFrench: chat\n###\nEnglish: dog\nFrench: chien\n###\n"
                    "English: bird\nFrench:")


def test_k_and_seed_choose_examples_reproducibly():
    p = FewShotPrompt("{input}={output}", example_separator="; ")
    examples = [(str(i), str(2 * i)) for i in range(10)]
    assert p.build(examples, "x", k=2) == "0=0; 1=2; x="
    a, b = p.build(examples, "x", k=3, seed=1), p.build(examples, "x", k=3, seed=1)
    assert a == b and a.count("=") == 4 and a != p.build(examples, "x", k=3)
    assert p.build(examples, "x", k=0) == "x="


def test_extra_fields_and_bad_input():
    p = FewShotPrompt("[{topic}] {input} -> {output}")
    text = p.build([{"topic": "t", "input": "a", "output": "b"}], {"topic": "u", "input": "c"})
    assert text == "[t] a -> b\n\n[u] c ->"
    with pytest.raises(ValueError, match="lacks the field"):
        p.build([("a", "b")], {"input": "c", "topic": "u"})
    with pytest.raises(ValueError, match="output"):
        FewShotPrompt("{input}")
    with pytest.raises(ValueError, match="last"):
        FewShotPrompt("{output} {input}")
    with pytest.raises(ValueError, match="k must be"):
        FewShotPrompt().build([("a", "b")], "c", k=2)
    with pytest.raises(TypeError, match="example"):
        FewShotPrompt().build(["ab"], "c")
