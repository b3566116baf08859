"""`mnist_common.flags`: a usage error is one line, and names the flag a
misspelled one was probably meant as."""

import pytest

from mnist_common.flags import OneLineParser, misspelling


@pytest.mark.parametrize("given, hint", [
    (["--dat=x"], "; did you mean --data, not --dat?"),
    (["--model_dir=m", "--epoch", "3"], "; did you mean --epochs, not --epoch?"),
    (["--data=x", "--bogus"], ""),          # unknown, but close to nothing
    (["-d", "x"], ""),                      # short options are not guessed at
    (["--", "--dat"], ""),                  # after --, arguments are not flags
    (["--epochs=3", "--dat"], "; did you mean --data, not --dat?"),
    (["--mod=m"], "; did you mean --model_dir, not --mod?"),   # an abbreviation
    (["--model_dirr=m"], "; did you mean --model_dir, not --model_dirr?"),
])
def test_misspelling_names_the_closest_known_flag(given, hint):
    assert misspelling(given, ["--data", "--epochs", "--model_dir", "-h"]) == hint


def parser():
    p = OneLineParser(prog="prog", allow_abbrev=False)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=1)
    return p


@pytest.mark.parametrize("argv, line", [
    (["--dat=x"], "error: the following arguments are required: --data; "
                  "did you mean --data, not --dat? (see --help)"),
    (["--data=x", "--epoch=3"], "error: unrecognized arguments: --epoch=3; "
                                "did you mean --epochs, not --epoch? (see --help)"),
    (["--data=x", "--epochs=three"],
     "error: argument --epochs: invalid int value: 'three' (see --help)"),
])
def test_a_usage_error_is_one_line_and_exit_status_2(argv, line, capsys):
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_a_flag_given_twice_is_refused_in_one_line(capsys):
    for argv in (["--data=x", "--data=y"], ["--data", "x", "--epochs=2", "--data=y"]):
        with pytest.raises(SystemExit) as stopped:
            parser().parse_args(argv)
        assert stopped.value.code == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("error: --data given twice (--data"), line
        assert line.endswith("; give each flag once (see --help)"), line


def test_a_flag_that_collects_its_occurrences_may_repeat_and_after_dashes_is_no_flag():
    p = OneLineParser(prog="prog", allow_abbrev=False)
    p.add_argument("--experiments", action="append", default=[])
    p.add_argument("--verbose", "-v", action="count", default=0)
    p.add_argument("rest", nargs="*")
    args = p.parse_args(["--experiments=a", "--experiments=b", "-v", "--verbose", "--",
                         "--experiments=c", "x"])
    assert (args.experiments, args.verbose, args.rest) == (["a", "b"], 2, ["--experiments=c",
                                                                            "x"])


def test_a_flag_given_twice_by_two_of_its_names_is_refused(capsys):
    p = OneLineParser(prog="prog", allow_abbrev=False)
    p.add_argument("--seed", "-s", type=int)
    with pytest.raises(SystemExit):
        p.parse_args(["-s", "1", "--seed=2"])
    assert capsys.readouterr().err == (
        "error: --seed given twice (-s, then --seed=2); give each flag once (see --help)\n")
