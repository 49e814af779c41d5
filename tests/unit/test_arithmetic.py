import pytest

from atlas_core.answers import boxed_format_reward, exact_match_reward, extract_answer, normalize_answer
from atlas_core.tasks.arithmetic import make_arithmetic_dataset, make_sft_dataset, solution_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{3} then \\boxed{7}", "7"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces kept whole
        ("<solution>12</solution> and 5", "12"),  # solution tag beats a trailing number
        ("\\boxed{4} <solution>9</solution>", "4"),  # boxed beats the solution tag
        ("first 3, then 1,250.0", "1250"),  # last number, normalised
        ("answer: -0.50", "-0.5"),
        # a real chat model's prose: the stated answer beats the numbers of a check after it
        ("So, the final answer is 8. Check: 8 - 3 = 5", "8"),
        ("4 + 7 + 2 = 13\n\nThe answer is: 13. That is 6 more than 7", "13"),
        ("The answer is \\boxed{}. 11 + 7 = 18", "18"),  # an empty box and no stated number: the last one
        ("\\boxed{ $1,000$ }", "1000"),
        ("\\boxed{Paris.}", "paris"),
        ("\\boxed{unclosed 8", "8"),  # an unbalanced box is ignored
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(("raw", "norm"), [("7.0", "7"), ("+3", "3"), ("-0", "0"), ("0.250", "0.25"), (" 12. ", "12")])
def test_normalize_numbers(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_reward_on_text_and_chat_completions():
    completions = [
        "3 + 4 = 7. \\boxed{7}",
        [{"role": "assistant", "content": "\\boxed{8}"}],
        [{"role": "assistant", "content": "<solution>7.0</solution>"}],
        "nothing",
    ]
    assert exact_match_reward(completions, ground_truth=["7", "7", "7", "7"]) == [1.0, 0.0, 1.0, 0.0]
    assert boxed_format_reward(completions) == [1.0, 1.0, 0.0, 0.0]


def test_dataset_is_deterministic_and_answers_are_correct():
    rows = make_arithmetic_dataset(50, seed=3, max_operand=20, operations=("+", "-", "*"))
    assert rows == make_arithmetic_dataset(50, seed=3, max_operand=20, operations=("+", "-", "*"))
    assert rows != make_arithmetic_dataset(50, seed=4, max_operand=20, operations=("+", "-", "*"))
    for row in rows:
        assert str(eval(row["question"])) == row["ground_truth"]  # noqa: S307 - our own generated expressions
        assert exact_match_reward([solution_text(row)], ground_truth=[row["ground_truth"]]) == [1.0]
    sft = make_sft_dataset(5, seed=3)
    assert set(sft[0]) == {"prompt", "completion"} and sft[0]["completion"][0]["role"] == "assistant"


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="operations"):
        make_arithmetic_dataset(3, operations=("/",))
    with pytest.raises(ValueError, match="n:"):
        make_arithmetic_dataset(0)


def test_huge_numbers_in_model_output_are_harmless():
    """Model output is untrusted: a huge exponent must neither raise nor hang (no giant ints)."""
    import tracemalloc

    tracemalloc.start()
    try:
        assert exact_match_reward(["\\boxed{1e5000}", "1e99999999"], ground_truth=["3", "3"]) == [0.0, 0.0]
        assert normalize_answer("9" * 5000) == "9" * 5000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # compared as text, never expanded: 10**99999999 alone would take over 40 MB
    assert normalize_answer("1e99999999") == "1e99999999" and normalize_answer("1E5000") == "1e5000"
    assert peak < 4_000_000, f"{peak} bytes allocated"
