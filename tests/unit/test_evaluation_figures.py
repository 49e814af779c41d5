"""atlas_core/evaluation_figures.py's side-by-side lines, as the benches print them."""

from atlas_core.evaluation_figures import Figures, TeachingEvaluation, comparison_lines, figures


def evaluation(**overrides: float | None) -> TeachingEvaluation:
    values: dict[str, float | None] = dict.fromkeys(Figures.__dataclass_fields__, 0.25)
    values.update(overrides)
    values["problems"] = 4
    return TeachingEvaluation(**values)  # problems an int, the rest floats


def test_a_teacher_row_formats_each_figure() -> None:
    report = evaluation(student_accuracy=0.5, guided_accuracy=0.625, accuracy_delta=0.125, guidance_tokens_mean=12.0)
    row = comparison_lines({"trained": report}, label_width=10)[1]
    assert row == "trained       50.0%    62.5%      +12.5    [+25.0, +25.0]      25.0%       12.0"


def test_an_evaluation_of_no_problems_prints_dashes_rather_than_raising() -> None:
    # figures() of no records has None for every figure (it raised a TypeError on 100 * None before).
    empty = TeachingEvaluation(**vars(figures([])))
    row = comparison_lines({"untrained": empty}, label_width=10)[1]
    assert row.split() == ["untrained", "-", "-", "-", "-", "-", "-"]
