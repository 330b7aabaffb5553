import pickle

import pytest

from attnlab.config.validate import (ConfigError, ConfigTypeError, check_types, choice, in_range, int_list,
                                     non_negative, positive, probability)


@pytest.mark.parametrize("check, message", [
    (lambda: choice("attention.kernel", "flash", ("auto", "eager")), "attention.kernel: 'flash' is not one of auto, eager"),
    (lambda: positive("optim.lr", "fast"), "optim.lr: expected a number > 0, got 'fast'"),
    (lambda: positive("optim.lr", 0), "optim.lr: expected a number > 0, got 0"),
    (lambda: positive("num_layers", 2.0, integer=True), "num_layers: expected an integer > 0, got 2.0"),
    (lambda: positive("num_layers", True, integer=True), "num_layers: expected an integer > 0, got True"),
    (lambda: positive("head_dim", -1, integer=True, optional=True), "head_dim: expected an integer > 0 or null, got -1"),
    (lambda: non_negative("attention.window", -1, integer=True), "attention.window: expected an integer >= 0, got -1"),
    (lambda: probability("dropout", 1.0), "dropout: expected a probability in [0, 1), got 1.0"),
    (lambda: in_range("data.mask_prob", 0, 0, 1, low_open=True, high_open=True),
     "data.mask_prob: expected a number in (0, 1), got 0"),
    (lambda: in_range("data.mask_prob", float("nan"), 0, 1), "data.mask_prob: expected a finite number, got nan"),
    (lambda: positive("optim.lr", float("inf")), "optim.lr: expected a finite number, got inf"),
    (lambda: int_list("attention.global_positions", [0, -1], low=0),
     "attention.global_positions: expected a list of integers >= 0, got [0, -1]"),
])
def test_messages_name_the_field_then_what_is_allowed(check, message):
    with pytest.raises(ConfigError) as err:
        check()
    assert str(err.value) == message


def test_accepted_values_pass():
    choice("a.b", "x", ("x", "y"))
    positive("a", 1e-9)
    positive("a", None, optional=True)
    non_negative("a", 0, integer=True)
    probability("a", 0)
    in_range("a", 1, 0, 1)
    assert int_list("a", (1, 2), low=0) == [1, 2]


def test_type_errors_are_type_and_value_errors_and_pickle():
    err = ConfigTypeError("optim.lr", "expected a number, got 'fast'")
    assert isinstance(err, TypeError) and isinstance(err, ValueError) and isinstance(err, ConfigError)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ConfigTypeError and str(again) == str(err) and again.path == "optim.lr"


def test_moved_replaces_the_root():
    assert str(ConfigError("attention.kernel", "bad").moved("", "model")) == "model.attention.kernel: bad"
    assert str(ConfigError("recipe.lr", "bad").moved("recipe", "job.recipe")) == "job.recipe.lr: bad"


def test_check_types_follows_the_annotations():
    from dataclasses import dataclass, field

    @dataclass
    class Inner:
        k: int = 1

        def __post_init__(self):
            check_types(self, "outer.inner")

    @dataclass
    class Outer:
        rate: float = 0.5
        size: int | None = None
        pair: tuple[float, float] = (0.0, 1.0)
        ids: list[int] = field(default_factory=list)
        flag: bool = False
        inner: Inner = field(default_factory=Inner)

        def __post_init__(self):
            check_types(self, "outer")

    out = Outer(rate=1, pair=[1, 2], ids=(3,), inner={"k": 2})
    assert out.rate == 1.0 and isinstance(out.rate, float) and out.pair == (1.0, 2.0) and out.ids == [3]
    assert out.inner == Inner(2)
    for kwargs, message in [
        (dict(rate="x"), "outer.rate: expected a number, got 'x'"),
        (dict(size=1.5), "outer.size: expected an integer or null, got 1.5"),
        (dict(pair=[1]), "outer.pair: expected a list of 2 numbers, got [1]"),
        (dict(ids=[1, "a"]), "outer.ids[1]: expected an integer, got 'a'"),
        (dict(flag=1), "outer.flag: expected true or false, got 1"),
        (dict(inner={"k": "a"}), "outer.inner.k: expected an integer, got 'a'"),
        (dict(inner=3), "outer.inner: expected a mapping of Inner fields, got int 3"),
    ]:
        with pytest.raises(ConfigTypeError) as err:
            Outer(**kwargs)
        assert str(err.value) == message
    with pytest.raises(ConfigError, match=r"^outer\.inner\.j: unknown inner field; allowed: k$"):
        Outer(inner={"j": 1})


def test_a_number_field_refuses_nan_infinity_and_ints_beyond_a_float():
    """Not a type error: a `float | None` field names the problem instead of 'expected a number or
    null', and an item of a tuple is named by its index."""
    from dataclasses import dataclass

    @dataclass
    class Opt:
        rate: float = 0.5
        clip: float | None = None
        pair: tuple[float, float] = (0.0, 1.0)

        def __post_init__(self):
            check_types(self, "opt")

    for kwargs, message in [
        (dict(rate=float("nan")), "opt.rate: expected a finite number, got nan"),
        (dict(rate=float("-inf")), "opt.rate: expected a finite number, got -inf"),
        (dict(rate=10 ** 400), f"opt.rate: expected a finite number, got {10 ** 400}"),
        (dict(clip=float("inf")), "opt.clip: expected a finite number, got inf"),
        (dict(pair=[0.5, float("nan")]), "opt.pair[1]: expected a finite number, got nan"),
    ]:
        with pytest.raises(ConfigError) as err:
            Opt(**kwargs)
        assert str(err.value) == message and not isinstance(err.value, TypeError)
    assert Opt(rate=10 ** 300, clip=-1e308).rate == 1e300
