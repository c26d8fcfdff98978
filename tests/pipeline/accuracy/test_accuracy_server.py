"""End to end against a real local HTTP server with a known error pattern: the extracted
accuracies must equal the truth exactly, failures are counted and nothing is lost."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from acc_server import AnswerServer, load_jsonl
from pipeline.config.accuracy import AccuracySpec
from pipeline.accuracy.stage import KeyRefusedError, NoAnswerError, ResumeError, run_accuracy
from pipeline.paths import ArmPaths

DATA = Path(__file__).resolve().parents[3] / "recipes" / "data" / "accuracy"
GSM = DATA / "gsm8k_synthetic.jsonl"
GPQA = DATA / "gpqa_synthetic.jsonl"
FAST = {"retries": 3, "retry_backoff_s": 0.01, "timeout_s": 10, "concurrency": 8}


def gsm_server(**pattern) -> AnswerServer:
    return AnswerServer(load_jsonl(GSM), **pattern)


def spec(**task) -> AccuracySpec:
    return AccuracySpec(tasks=[{**FAST, **task}])


def test_gsm8k_known_pattern_exact(tmp_path):
    pattern = dict(wrong={"syn-gsm-test-001", "syn-gsm-test-007"}, invalid={"syn-gsm-test-002"},
                   loose={"syn-gsm-test-003", "syn-gsm-test-010"}, fail={"syn-gsm-test-004"},
                   flaky={"syn-gsm-test-005", "syn-gsm-test-006"})
    lines, arm = [], ArmPaths(tmp_path)
    with gsm_server(**pattern) as srv:
        res = run_accuracy(spec(name="gsm8k", data=GSM), url=srv.url, model="m",
                           out_dir=arm.accuracy_dir, progress=lines.append)
        assert srv.requests_by_id["syn-gsm-test-004"] == 4   # 1 try + 3 retries
        assert srv.requests_by_id["syn-gsm-test-005"] == 2
        assert not any("train" in k for k in srv.requests_by_id)  # shots never asked
    (t,) = res.tasks
    # 40 test questions: flexible misses wrong(2)+invalid(1)+failed(1); strict also loose(2).
    assert (t.n_questions, t.n_records) == (40, 40)
    assert t.accuracy == 36 / 40 and t.accuracy_strict == 34 / 40
    assert (t.n_failed, t.n_retried, t.n_invalid) == (1, 3, 1)
    # The files are where the run-directory layout (pipeline/paths.py) says.
    assert (t.records_path, t.summary_path) == (str(arm.accuracy_records("gsm8k")),
                                                str(arm.accuracy_summary("gsm8k")))
    summary = json.loads(arm.accuracy_summary("gsm8k").read_text())
    assert summary["n_invalid_strict"] == 3 and summary["invalid_rate"] == 1 / 40
    recs = {r["id"]: r for r in map(json.loads, arm.accuracy_records("gsm8k")
                                    .read_text().splitlines())}
    assert len(recs) == 40
    failed = recs["syn-gsm-test-004"]
    assert failed["failed"] and failed["retried"] and failed["output"] is None
    assert "500" in failed["error"] and failed["correct"] is False
    wrong = recs["syn-gsm-test-001"]
    assert wrong["extracted"] == str(int(wrong["gold"]) + 1) and not wrong["correct"]
    assert recs["syn-gsm-test-005"]["retried"] and recs["syn-gsm-test-005"]["correct"]
    assert recs["syn-gsm-test-003"]["correct"] and recs["syn-gsm-test-003"]["extracted_strict"] is None
    assert {"id", "repeat", "prompt_hash", "output", "extracted", "gold", "correct", "latency_s",
            "finish_reason", "retried", "failed"} <= set(failed)
    assert lines and lines[-1].startswith("gsm8k: 40/40 done: 39 answered, 1 failed, 3 retried")


def test_gpqa_known_pattern_exact_with_repeats(tmp_path):
    pattern = dict(wrong={"syn-gpqa-001"}, invalid={"syn-gpqa-002"}, fail={"syn-gpqa-003"},
                   flaky={"syn-gpqa-004"})
    with AnswerServer(gpqa_rows=load_jsonl(GPQA), **pattern) as srv:
        res = run_accuracy(spec(name="gpqa_diamond", data=GPQA, repeats=3), url=srv.url,
                           model="m", out_dir=tmp_path)
    (t,) = res.tasks
    assert (t.n_questions, t.repeats, t.n_records) == (24, 3, 72)
    assert t.accuracy == 63 / 72            # 3 ids x 3 repeats wrong, invalid or failed
    assert (t.n_failed, t.n_retried, t.n_invalid) == (3, 6, 3)
    recs = [json.loads(x) for x in Path(t.records_path).read_text().splitlines()]
    # The option order changes with the repeat: gold letters are not all equal per question.
    golds = {}
    for r in recs:
        golds.setdefault(r["id"], set()).add(r["gold"])
    assert sum(len(g) > 1 for g in golds.values()) >= 12
    assert all(r["extracted"] == r["gold"] for r in recs if r["id"] == "syn-gpqa-004")
    summary = json.loads(Path(t.summary_path).read_text())
    assert summary["accuracy_by_repeat"] == [21 / 24] * 3
    per_q = summary["per_question_accuracy"]
    assert len(per_q) == 24 and per_q["syn-gpqa-001"] == 0.0 and per_q["syn-gpqa-004"] == 1.0


def test_resume_asks_only_missing_and_failed(tmp_path):
    task = dict(name="gsm8k", data=GSM, limit=12)
    with gsm_server(fail={"syn-gsm-test-004"}) as srv:
        first = run_accuracy(spec(**task), url=srv.url, model="m", out_dir=tmp_path).tasks[0]
        assert first.n_failed == 1 and first.accuracy == 11 / 12
    path = Path(first.records_path)
    lines = path.read_text().splitlines()
    # A crash mid-run: 7 whole lines and a torn one survive.
    path.write_text("\n".join(lines[:7]) + "\n" + lines[7][:25])
    with gsm_server() as srv:   # the server has recovered
        again = run_accuracy(spec(**task), url=srv.url, model="m", out_dir=tmp_path).tasks[0]
        asked = set(srv.requests_by_id)
    kept = {json.loads(x)["id"] for x in lines[:7]} - {"syn-gsm-test-004"}
    assert asked == {f"syn-gsm-test-{i:03d}" for i in range(12)} - kept
    assert again.n_reused == len(kept) and again.n_records == 12
    assert again.accuracy == 1.0 and again.n_failed == 0
    with gsm_server() as srv:
        third = run_accuracy(spec(**task), url=srv.url, model="m", out_dir=tmp_path).tasks[0]
        assert not srv.requests_by_id and third.n_reused == 12


def test_resume_refuses_records_of_another_prompt(tmp_path):
    with gsm_server() as srv:
        run_accuracy(spec(name="gsm8k", data=GSM, limit=3), url=srv.url, model="m",
                     out_dir=tmp_path)
        with pytest.raises(ResumeError, match=r"different prompt .*use a new output folder"):
            run_accuracy(spec(name="gsm8k", data=GSM, limit=3, num_shots=2), url=srv.url,
                         model="m", out_dir=tmp_path)
        with pytest.raises(ResumeError, match="made with model 'm', this run asks 'other'"):
            run_accuracy(spec(name="gsm8k", data=GSM, limit=3), url=srv.url, model="other",
                         out_dir=tmp_path)


def test_resume_refuses_answers_asked_with_other_generation_settings(tmp_path, capsys):
    # Guarantee: a rerun into the same --out with a setting that changes answers stops with one line naming the
    # setting, its old and new value and the way out, and asks nothing; the summary records the settings.
    from pipeline.accuracy.cli import eval_main

    out = tmp_path / "ev"
    base = ["--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit", "3", "--out", str(out),
            "--max-tokens", "100", "--temperature", "0.5", "--seed", "1", "--extra-body", '{"top_p": 0.9}']
    changed = {"--max-tokens": ("100", "200"), "--temperature": ("0.5", "0.7"), "--seed": ("1", "2"),
               "--extra-body": ('{"top_p": 0.9}', '{"top_p": 0.1}')}
    with gsm_server() as srv:
        assert eval_main(["--url", srv.url, *base]) == 0
        summary = json.loads((out / "gsm8k.summary.json").read_text())
        assert summary["generation"] == {"max_tokens": 100, "temperature": 0.5, "seed": 1,
                                         "extra_body": {"top_p": 0.9}}
        capsys.readouterr()
        for flag, (old, new) in changed.items():
            argv = list(base)
            argv[argv.index(flag) + 1] = new
            assert eval_main(["--url", srv.url, *argv]) == 1
            err = capsys.readouterr().err.splitlines()
            assert err[-1] == (f"pipeline eval: error: {out / 'gsm8k.jsonl'}: record id=syn-gsm-test-000 repeat=0 "
                               f"was answered with {flag} {old}, this run asks {new}; its answer would count as "
                               "measured with the new setting: use a new output folder or delete the file")
        assert len(srv.bodies) == 3   # the first run's only
        # Unchanged: everything is reused.
        assert eval_main(["--url", srv.url, *base]) == 0
        assert len(srv.bodies) == 3
    assert "3 already answered, asking 0" in capsys.readouterr().err


def test_resume_of_a_recorded_recipe_reuses_answers_and_names_recipe_fields(tmp_path):
    # Guarantee: `pipeline run --resume` revalidates the recipe from the manifest's JSON; the same settings so
    # read back still resume, and a changed one is named by its recipe path.
    task = dict(name="gsm8k", data=GSM, limit=6, temperature=0.6, seed=4,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20})
    with gsm_server() as srv:
        first = run_accuracy(spec(**task), url=srv.url, model="m", out_dir=tmp_path).tasks[0]
    path = Path(first.records_path)
    path.write_text("\n".join(path.read_text().splitlines()[:4]) + "\n")   # a crash after 4 answers
    recorded = AccuracySpec.model_validate(json.loads(json.dumps(spec(**task).model_dump(mode="json"))))
    with gsm_server() as srv:
        again = run_accuracy(recorded, url=srv.url, model="m", out_dir=tmp_path).tasks[0]
        assert len(srv.bodies) == 2
        with pytest.raises(ResumeError, match=r"answered with accuracy\.tasks\.0\.temperature 0\.6, "
                                              r"this run asks 0\.0; .*use a new output folder"):
            run_accuracy(spec(**{**task, "temperature": 0.0}), url=srv.url, model="m", out_dir=tmp_path)
    assert (again.n_reused, again.n_records, again.accuracy) == (4, 6, 1.0)


def test_unreachable_server_fails_the_task_and_keeps_its_records(tmp_path):
    # Guarantee: a task none of whose requests got an answer is an error naming the endpoint, not an accuracy of 0.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()   # nothing listens here now
    task, lines = spec(name="gsm8k", data=GSM, limit=5, retries=1), []
    with pytest.raises(NoAnswerError, match=rf"gsm8k: none of its 5 requests got an answer \(first error: "
                                            rf"ClientConnectorError: .*\); is http://127.0.0.1:{port}/v1/chat/"
                                            rf"completions up and serving 'm'\?"):
        run_accuracy(task, url=f"http://127.0.0.1:{port}/v1", model="m", out_dir=tmp_path, progress=lines.append)
    assert lines[-1].startswith("gsm8k: 5/5 done: 0 answered, 5 failed, 5 retried, ")   # failed are not answered
    recs = [json.loads(x) for x in (tmp_path / "gsm8k.jsonl").read_text().splitlines()]
    assert len(recs) == 5 and all(r["failed"] and r["attempts"] == 2 and "ClientConnectorError" in r["error"]
                                  for r in recs)
    with gsm_server() as srv:   # the endpoint is back: the rerun asks every failed question again
        (t,) = run_accuracy(task, url=srv.url, model="m", out_dir=tmp_path).tasks
    assert (t.n_records, t.n_failed, t.n_reused, t.accuracy) == (5, 0, 0, 1.0)


def test_a_url_aiohttp_cannot_send_to_is_not_retried(tmp_path):
    # Guarantee: a malformed or non-HTTP URL fails each request at its first attempt (a retry cannot fix it).
    with pytest.raises(NoAnswerError, match=r"first error: (NonHttpUrlClientError|InvalidURL)"):
        run_accuracy(spec(name="gsm8k", data=GSM, limit=2, retry_backoff_s=5), url="ftp://x", model="m",
                     out_dir=tmp_path)
    recs = [json.loads(x) for x in (tmp_path / "gsm8k.jsonl").read_text().splitlines()]
    assert [(r["failed"], r["attempts"]) for r in recs] == [(True, 1), (True, 1)]


def test_refused_logprobs_name_the_switch_that_turns_them_off(tmp_path):
    # Guarantee: an engine that refuses `logprobs` fails the task with the task's switch named, and the same task
    # without them answers on the same endpoint.
    with gsm_server(refuse_logprobs=True) as srv:
        with pytest.raises(NoAnswerError, match=r"first error: HTTP 400: .*logprobs are not supported.*"
                                                r"set `logprobs: false` on task 'gsm8k' \(`pipeline eval --no-logprobs`\)"):
            run_accuracy(spec(name="gsm8k", data=GSM, limit=3), url=srv.url, model="m", out_dir=tmp_path)
        (t,) = run_accuracy(spec(name="gsm8k", data=GSM, limit=3, logprobs=False), url=srv.url, model="m",
                            out_dir=tmp_path).tasks
        assert all("logprobs" not in b for b in srv.bodies[-3:])
    assert (t.n_records, t.n_failed, t.accuracy) == (3, 0, 1.0)


def test_timeout_is_retried(tmp_path):
    with gsm_server(slow={"syn-gsm-test-001"}, slow_s=1.5) as srv:
        task = spec(name="gsm8k", data=GSM, limit=3, timeout_s=0.3)
        (t,) = run_accuracy(task, url=srv.url, model="m", out_dir=tmp_path).tasks
        assert srv.requests_by_id["syn-gsm-test-001"] == 2
    assert (t.accuracy, t.n_failed, t.n_retried) == (1.0, 0, 1)


def test_requests_that_all_time_out_name_the_timeout_not_the_endpoint(tmp_path):
    # Guarantee: an endpoint that took every request but answered none in time is named slow, with the timeout
    # to raise; it is not asked whether it is up.
    with gsm_server(slow={"syn-gsm-test-000", "syn-gsm-test-001"}, slow_s=1.5) as srv:
        with pytest.raises(NoAnswerError) as e:
            run_accuracy(spec(name="gsm8k", data=GSM, limit=2, timeout_s=0.3, retries=0), url=srv.url, model="m",
                         out_dir=tmp_path)
    assert str(e.value).startswith(
        "gsm8k: none of its 2 requests got an answer (first error: TimeoutError: no complete answer within 0.3 s); "
        f"{srv.url}/v1/chat/completions took every request but finished none within 0.3 s: if it is just slow "
        "(long answers, a cold start), raise `timeout_s` on task 'gsm8k' (`pipeline eval --timeout`). The records")
    assert "up and serving" not in str(e.value)


def test_eval_command_sends_the_request_the_flags_describe(tmp_path, capsys):
    from pipeline.accuracy.cli import eval_main

    with gsm_server() as srv:
        rc = eval_main(["--url", srv.url + "/v1/chat/completions", "--model", "mm", "--task",
                        "gsm8k", "--data", str(GSM), "--limit", "2", "--max-tokens", "100",
                        "--temperature", "0.5", "--seed", "3", "--out", str(tmp_path),
                        "--extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}'])
        bodies = sorted(srv.bodies, key=lambda b: b["messages"][-1]["content"])
    assert rc == 0
    assert capsys.readouterr().out.startswith("gsm8k: accuracy 1.0000 (strict 1.0000) over 2")
    assert len(bodies) == 2 and len(bodies[0]["messages"]) == 11   # 5 shots x 2 + question
    b = bodies[0]
    assert (b["model"], b["max_tokens"], b["temperature"]) == ("mm", 100, 0.5)
    assert b["chat_template_kwargs"] == {"enable_thinking": False}
    assert isinstance(b["seed"], int) and bodies[1]["seed"] != b["seed"]


def test_eval_names_answers_cut_off_by_the_token_limit(tmp_path, capsys):
    # Guarantee: answers stopped by max_tokens are counted on the summary line and named with the flag that gives
    # them room, most plainly when none finished; a run without any says nothing of it.
    from pipeline.accuracy.cli import eval_main

    def run(out: str, cut: set[str]) -> tuple[str, list[str]]:
        with gsm_server(truncated=cut) as srv:
            assert eval_main(["--url", srv.url, "--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit",
                              "3", "--max-tokens", "64", "--out", str(tmp_path / out)]) == 0
        got = capsys.readouterr()
        return got.out, got.err.splitlines()

    out, err = run("none", set())
    assert "; truncated 0; records " in out and not any("warning" in line for line in err)
    out, err = run("some", {"syn-gsm-test-000", "syn-gsm-test-002"})
    assert "; truncated 2; records " in out
    assert err[-1] == ("pipeline eval: warning: gsm8k: 2 of 3 answers stopped at the 64-token limit (finish_reason "
                       "'length') and may have lost their final answer; raise --max-tokens to let them finish")
    out, err = run("all", {f"syn-gsm-test-{i:03d}" for i in range(3)})
    assert out.startswith("gsm8k: accuracy 0.0000") and "; truncated 3; records " in out
    assert err[-1] == ("pipeline eval: warning: gsm8k: all 3 answers stopped at the 64-token limit (finish_reason "
                       "'length'), none finished: this accuracy measures the budget, not the model; raise --max-tokens")
    assert json.loads((tmp_path / "all" / "gsm8k.summary.json").read_text())["n_truncated"] == 3


def test_eval_sends_the_api_key_as_a_bearer_header_from_the_flag_or_the_environment(tmp_path, capsys, monkeypatch):
    # Guarantee: the key reaches the endpoint as OpenAI's bearer header, --api-key before OPENAI_API_KEY, and is
    # written nowhere: not in the records, the summary or the progress lines.
    from pipeline.accuracy.cli import eval_main

    key = "sk-test-0123456789"
    argv = ["--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit", "2"]
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with gsm_server(api_key=key) as srv:
        assert eval_main(["--url", srv.url, *argv, "--api-key", key, "--out", str(tmp_path / "flag")]) == 0
        monkeypatch.setenv("OPENAI_API_KEY", key)
        assert eval_main(["--url", srv.url, *argv, "--out", str(tmp_path / "env")]) == 0
        monkeypatch.setenv("OPENAI_API_KEY", "sk-another")
        assert eval_main(["--url", srv.url, *argv, "--api-key", key, "--out", str(tmp_path / "both")]) == 0
    assert srv.authorizations == [f"Bearer {key}"] * 6
    assert all(key not in f.read_text() for f in tmp_path.rglob("*") if f.is_file())
    assert key not in capsys.readouterr().err


def test_an_error_body_that_quotes_the_key_back_is_recorded_with_the_key_masked(tmp_path, monkeypatch):
    # Guarantee: an endpoint's failure that is not about the key (a 500 whose body quotes the request's headers)
    # keeps its error text in the records, with the key masked.
    from pipeline.accuracy.cli import eval_main

    key = "sk-test-0123456789"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with gsm_server(api_key=key, fail={"syn-gsm-test-000"}) as srv:
        assert eval_main(["--url", srv.url, "--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit", "2",
                          "--retries", "0", "--api-key", key, "--out", str(tmp_path)]) == 0
    failed = [r for r in load_jsonl(tmp_path / "gsm8k.jsonl") if r["failed"]]
    assert [r["error"] for r in failed] == ["HTTP 500: injected failure (request had Authorization: Bearer ***)"]
    assert all(key not in f.read_text() for f in tmp_path.rglob("*") if f.is_file())


def test_a_missing_or_refused_api_key_is_one_line_and_stops_the_task(tmp_path, capsys, monkeypatch):
    # Guarantee: a 401 or 403 says the endpoint refused the key (or that none was given) and where a key comes
    # from, without quoting the key; the task stops at once, not after every question's retries.
    from pipeline.accuracy.cli import eval_main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    argv = ["--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit", "20", "--concurrency", "2",
            "--out", str(tmp_path)]
    where = "the key comes from --api-key, else the OPENAI_API_KEY environment variable"
    with gsm_server(api_key="sk-right") as srv:
        endpoint = f"{srv.url}/v1/chat/completions"
        assert eval_main(["--url", srv.url, *argv]) == 1
        assert capsys.readouterr().err.splitlines()[-1] == (
            f'pipeline eval: error: gsm8k: {endpoint} answered HTTP 401 ({{"error": {{"message": "no API key given", '
            f'"type": "invalid_request_error"}}}}) and no API key was given; {where}')
        assert 1 <= len(srv.authorizations) <= 2 and set(srv.authorizations) == {None}  # the two in flight
        assert eval_main(["--url", srv.url, *argv, "--api-key", "sk-wrong"]) == 1
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == (
            f'pipeline eval: error: gsm8k: {endpoint} refused the API key (HTTP 403: {{"error": {{"message": '
            f'"Incorrect API key provided: ***", "type": "invalid_request_error"}}}}); {where}')
        assert "sk-wrong" not in err
        assert eval_main(["--url", srv.url, *argv, "--api-key", "sk-right"]) == 0   # the same --out goes on
    assert "0 already answered, asking 20" in capsys.readouterr().err


def test_the_recipe_stage_sends_no_key_and_says_so_when_its_engine_wants_one(tmp_path, monkeypatch):
    # Guarantee: the engine a recipe starts is asked without a key, even with OPENAI_API_KEY set (a hosted API's
    # key is not sent to it); one that wants a key is named in one line with the way out.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hosted")
    with gsm_server(api_key="sk-engine") as srv:
        with pytest.raises(KeyRefusedError, match=r"^gsm8k: .* answered HTTP 401 \(.*\) and no API key was given; "
                                                  r"the accuracy stage sends none to the engine the pipeline started: "
                                                  r"start it without an API key, or score a keyed endpoint with "
                                                  r"`pipeline eval --api-key`$"):
            run_accuracy(spec(name="gsm8k", data=GSM, limit=2), url=srv.url, model="m", out_dir=tmp_path)
    assert set(srv.authorizations) == {None}
