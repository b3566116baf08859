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
