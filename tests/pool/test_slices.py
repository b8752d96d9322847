import pytest

from jupyter_gpu_pool.pool import SliceSpec, format_size, parse_size

GiB = 2**30


@pytest.mark.parametrize(
    "text, memory, sm, whole, count",
    [
        ("10GiB", 10 * GiB, None, False, 1),
        ("10 GiB", 10 * GiB, None, False, 1),
        ("10gib", 10 * GiB, None, False, 1),
        ("512MiB", 512 * 2**20, None, False, 1),
        ("1.5GiB", int(1.5 * GiB), None, False, 1),
        ("40GB", 40 * 10**9, None, False, 1),
        ("10GiB,25%", 10 * GiB, 25, False, 1),
        (" 20GiB , 50% ", 20 * GiB, 50, False, 1),
        ("whole", None, None, True, 1),
        ("WHOLE", None, None, True, 1),
        ("2 x whole", None, None, True, 2),
        ("2xwhole", None, None, True, 2),
    ],
)
def test_valid_slices_parse(text, memory, sm, whole, count):
    spec = SliceSpec.parse(text)
    assert (spec.memory, spec.sm_percent, spec.whole, spec.gpu_count) == (memory, sm, whole, count)


@pytest.mark.parametrize("spec", ["10GiB", "10GiB,25%", "whole", "2 x whole", "1536MiB,100%"])
def test_canonical_text_round_trips(spec):
    parsed = SliceSpec.parse(spec)
    assert SliceSpec.parse(parsed.to_text()) == parsed


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "not a slice"),
        ("   ", "not a slice"),
        ("-10GiB", "more than zero"),
        ("0GiB", "more than zero"),
        ("10", "no unit"),
        ("10 parsecs", "unknown unit 'parsecs'"),
        ("ten GiB", "not a size"),
        ("10GiB,0%", "between 1% and 100%"),
        ("10GiB,101%", "between 1% and 100%"),
        ("10GiB,12.5%", "whole percentage"),
        ("10GiB,half", "not an SM share"),
        ("10GiB,25%,3", "optional SM share"),
        ("0 x whole", "at least 1"),
        ("wholes", "not a size"),
        (None, "not a slice"),
        (10, "not a slice"),
    ],
)
def test_bad_slices_are_refused_with_the_bad_text_named(text, words):
    with pytest.raises(ValueError) as err:
        SliceSpec.parse(text)
    assert words in str(err.value)
    if isinstance(text, str) and text.strip():
        assert repr(text) in str(err.value) or text.strip() in str(err.value)


def test_sizes_format_for_people():
    assert format_size(10 * GiB) == "10 GiB"
    assert format_size(int(1.5 * GiB)) == "1.5 GiB"
    assert format_size(512 * 2**20) == "512 MiB"
    assert format_size(None) == "unlimited"
    assert parse_size("1TiB") == 2**40


def test_slice_accounting_on_a_gpu():
    assert SliceSpec.parse("10GiB,25%").sm_on() == 25
    assert SliceSpec.parse("10GiB").sm_on() == 0
    assert SliceSpec.parse("whole").sm_on() == 100
    assert SliceSpec.parse("whole").memory_on(80 * GiB) == 80 * GiB
