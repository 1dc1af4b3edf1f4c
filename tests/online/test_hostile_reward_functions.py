"""Reward functions are user code: whatever one does (sys.exit at import or in a call, raise, never
return, edit its arguments) ends in one line naming it and exit 2, or changes nothing that is stored."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.online.rewards import RewardFunctionScorer
from prefdata.online.score import reward_stats, score

PROMPT = [{"role": "user", "content": "Name a color."}]


def _generations(tmp_path: Path) -> Path:
    rows = [{"prompt": PROMPT, "completion": c, "sample": k, "source_file": "p.jsonl", "source_line": 1,
             "finished": True, "prompt_ids": [1, 2, 3]} for k, c in enumerate(["Blue.", "Red, I think."])]
    path = tmp_path / "generations.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _reward_file(tmp_path: Path, body: str, at_import: str = "") -> str:
    path = tmp_path / "rules.py"
    path.write_text(f"import sys, time\n{at_import}\n\ndef reward(prompts, completions, **kwargs):\n{body}\n")
    return f"{path}:reward"


def _score_cli(generations: Path, spec: str, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["score", str(generations), "--reward-fn", spec, "--no-progress", *extra])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("body, at_import, said", [
    ("    sys.exit(0)", "", "called sys.exit(0)"),
    ("    sys.exit(3)", "", "called sys.exit(3)"),
    ("    return [1.0, 2.0]", "sys.exit(0)", "importing"),
    ("    return [1.0, 2.0]", "raise SystemExit('bye')", "importing"),
    ("    raise KeyError('x\\ny')", "", "raised KeyError"),
    ("    raise GeneratorExit()", "", "raised GeneratorExit"),
])
def test_exits_and_errors_in_user_code_are_one_line_exit_2(tmp_path, capsys, body, at_import, said):
    generations = _generations(tmp_path)
    before = generations.read_text()
    spec = _reward_file(tmp_path, body, at_import)
    code, err = _score_cli(generations, spec, capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert said in err and "rules.py" in err  # names the function's file (and the function)
    assert generations.read_text() == before  # nothing scored, nothing rewritten
    assert not (tmp_path / "pairs.jsonl").exists()


@pytest.mark.parametrize("body, at_import", [
    ("    time.sleep(3600)", ""),
    ("    while True:\n        pass", ""),
    ("    return [1.0, 2.0]", "time.sleep(3600)"),
])
def test_a_reward_function_that_never_returns_is_stopped_by_the_timeout(tmp_path, capsys, body, at_import):
    spec = _reward_file(tmp_path, body, at_import)
    started = time.monotonic()
    code, err = _score_cli(_generations(tmp_path), spec, capsys, "--reward-timeout", "1")
    assert time.monotonic() - started < 30
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "did not return within 1 s (--reward-timeout)" in err and "rules.py" in err


def test_the_timeout_holds_off_the_main_thread_too(tmp_path):
    scorer = RewardFunctionScorer(_reward_file(tmp_path, "    time.sleep(3600)"), timeout=0.5)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            scorer(["p"], ["c"])
        except PrefdataError as exc:
            caught.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(20)
    assert not worker.is_alive() and "did not return within 0.5 s" in str(caught[0])


def test_a_bad_timeout_is_refused(tmp_path, capsys):
    spec = _reward_file(tmp_path, "    return [1.0, 2.0]")
    for value in ("0", "-1", "nan", "abc"):
        with pytest.raises(SystemExit) as exit_:
            _score_cli(_generations(tmp_path), spec, capsys, "--reward-timeout", value)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and "--reward-timeout" in err and len(err.splitlines()) == 1
    for value in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(PrefdataError, match="--reward-timeout must be a number of seconds > 0"):
            score(_generations(tmp_path), reward_fn=spec, progress=False, reward_timeout=value)


def test_a_function_that_edits_its_arguments_changes_nothing_stored(tmp_path):
    body = ('    prompts[0][0]["content"] = "HACKED"\n    completions[0][0]["content"] = "HACKED"\n'
            '    kwargs["sample"][0] = 99\n    return [float(len(c[0]["content"])) for c in completions]')
    generations = _generations(tmp_path)
    score(generations, reward_fn=_reward_file(tmp_path, body), progress=False)
    rows = [json.loads(line) for line in generations.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [PROMPT, PROMPT]
    assert [row["completion"] for row in rows] == ["Blue.", "Red, I think."]
    assert [row["sample"] for row in rows] == [0, 1]
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert "HACKED" not in json.dumps(pairs) and pairs[0]["prompt"] == PROMPT


def test_reward_statistics_of_huge_rewards_do_not_overflow():
    mean, sd = reward_stats([1.7e308, 1.7e308, float("nan")])
    assert mean == pytest.approx(1.7e308) and sd == 0.0
    assert reward_stats([1.7e308, -1.7e308]) == (0.0, pytest.approx(1.7e308))
    assert reward_stats([float("inf")]) == (None, None)


def test_an_online_round_whose_training_diverges_stops_the_run_with_exit_1(tmp_path, tiny_model_dir, prompts_file,
                                                                           rules_file, capsys):
    """The online rounds' train stage stops as `prefdata train` does: exit 1, one line naming the round
    and the step, and no policy of that round saved (no later round samples from it)."""
    out = tmp_path / "run"
    capsys.readouterr()
    code = main(["online", str(prompts_file), "--model", tiny_model_dir, "--reward-fn", f"{rules_file}:length",
                 "--output", str(out), "--rounds", "3", "--prompts-per-round", "4", "--samples", "3",
                 "--max-new-tokens", "6", "--batch-pairs", "2", "--lr", "1e30", "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert len(err) == 1 and "prefdata online: error: round " in err[0] and "training stopped" in err[0]
    from safetensors.torch import load_file

    for weights in out.rglob("*.safetensors"):
        assert all(bool(t.isfinite().all()) for t in load_file(weights).values()), weights


def test_a_timer_the_caller_set_keeps_running(tmp_path):
    """The timeout borrows SIGALRM for the call only: an alarm the caller had set still fires afterwards."""
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        scorer = RewardFunctionScorer(_reward_file(tmp_path, "    return [1.0 for _ in completions]"), timeout=30)
        assert scorer(["p"], ["c"]) == [1.0]
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
        time.sleep(1.5)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_online_with_a_reward_function_that_exits_at_import_is_exit_2(tmp_path, tiny_model_dir, prompts_file, capsys):
    spec = _reward_file(tmp_path, "    return [1.0 for _ in completions]", at_import="sys.exit(0)")
    capsys.readouterr()
    code = main(["online", str(prompts_file), "--model", tiny_model_dir, "--reward-fn", spec, "--output",
                 str(tmp_path / "run"), "--rounds", "1", "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "called sys.exit(0)" in err, err
    assert not list((tmp_path / "run").glob("round-*"))
