"""Lesson 13's exercise checkers reject wrong answers: a LitAPI that does not batch, splits wrongly, or pools
wrongly; a Triton config with preferred sizes or the wrong delay. (The reference solutions pass in
tests/test_exercises.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils import exercises
from course_utils.lesson_exercises import l13

SOLUTION = l13.SOLUTION_FILE.read_text()


def _variant(tmp_path: Path, old: str, new: str) -> str:
    assert old in SOLUTION, old
    path = tmp_path / "wrong_api.py"
    path.write_text(SOLUTION.replace(old, new))
    return f"{path}:SolutionEmbedAPI"


WRONG = {
    "unbatch returns the whole batch": (
        "        return list(emb)",
        "        return [emb]",
        "one output per request",
    ),
    "no batching: the model runs once per sentence": (
        "        enc = enc.to(self.device)\n        with torch.inference_mode():\n"
        "            tokens = self.model(**enc).last_hidden_state",
        "        enc = enc.to(self.device)\n        with torch.inference_mode():\n"
        "            tokens = torch.cat([self.model(**{k: v[i : i + 1] for k, v in enc.items()}).last_hidden_state"
        " for i in range(len(enc['input_ids']))])",
        "ran the model 4 times",
    ),
    "mean over padding too": (
        "(tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)",
        "tokens.mean(1)",
        "differ from the model's own",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_litapi_checker_rejects(name, tmp_path):
    old, new, words = WRONG[name]
    with pytest.raises(AssertionError, match=words):
        exercises.get("13.litapi").checker(_variant(tmp_path, old, new))


def test_litapi_unsolved_stub_is_not_attempted(tmp_path, capsys):
    path = tmp_path / "stub.py"
    path.write_text(
        "import litserve as ls\n\n\nclass Stub(ls.LitAPI):\n"
        "    def setup(self, device):\n        raise NotImplementedError\n"
    )
    exercises.check("13.litapi", f"{path}:Stub")
    assert "not solved yet" in capsys.readouterr().out


def test_litapi_checker_names_a_bad_answer():
    with pytest.raises(AssertionError, match="path/to/file.py:ClassName"):
        exercises.get("13.litapi").checker("nowhere.py:X")


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda *a: l13.triton_config(*a).replace("dynamic_batching {", "dynamic_batching { preferred_batch_size: [4]"),
         "preferred_batch_size"),
        (lambda n, m, t, b, h: l13.triton_config(n, m, t, b, 0.0), "queue delay"),
        (lambda *a: l13.triton_config(*a).replace("max_queue_delay_microseconds", "delay_us"), "does not parse"),
        (lambda n, m, t, b, h: l13.triton_config(n, 1, t, b, h), "max_batch_size"),
    ],
)  # fmt: skip
def test_triton_config_checker_rejects(fn, words):
    with pytest.raises(AssertionError, match=words):
        exercises.get("13.triton-config").checker(fn)
