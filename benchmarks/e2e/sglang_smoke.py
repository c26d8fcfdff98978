"""One real sglang server per arm of a recipe, a few greedy requests each: does vattn serve, and what moves?

    python3 benchmarks/e2e/sglang_smoke.py --out DIR [--recipe R.yaml] [--prompts 16] [--long-tokens 6000]

Each arm's server is the recipe's own command and env (default recipes/h200-sglang-qwen3-hd256.yaml, resolved
by `pipeline plan`'s code), so what this checks is what `pipeline run` of that recipe would start: sglang 0.5.17
through `python -m vattn.sglang.launch`, CUDA graphs on, STANDALONE speculative decoding with 4 draft tokens.
Every prompt is asked --repeats times on each server, pass after pass, the radix cache flushed before each: pass
2 against pass 1 is the A/A of one server. Per arm it writes DIR/<arm>.server.log and DIR/<arm>.json (outputs with
the chosen tokens' logprobs, the vattn path counters from the log), then DIR/smoke.json: both arms' counters, whether CUDA graphs were captured,
greedy-output identity (the first differing token of each pair, by the model's tokenizer) and the logprob drift
over each pair's shared tokens (analysis.outputs), off vs on and within each server. No aiperf: the requests are
plain OpenAI chat completions, half of them with a long random prefix so that target verify reads thousands of
KV tokens. With the recipes' dummy weights, sglang's own initialisation answers every prompt alike (each
arm's `distinct_outputs` says so), and then identity and drift cannot show a kernel change: `--dummy-init
scaled` gives both servers weights whose answers depend on the prompt (vattn.sglang.dummy_init).

    python3 benchmarks/e2e/sglang_smoke.py --across DIR_A DIR_B --out DIR

starts nothing: it compares two smoke runs of one recipe (first passes), each arm's server against the same
arm's server of the other run (the A/A across server launches, which a kernel change must beat) and off of one
against on of the other, into DIR/across.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "h200-sglang-qwen3-hd256.yaml"


def arm_server(recipe: Path, arm: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The first run of `arm` in the recipe's plan: its server argv (on `port`) and env."""
    from pipeline.config.recipe import load_recipe
    from pipeline.plan import build_plan

    plan = build_plan(load_recipe(recipe), Path("/tmp/sglang-smoke-plan"))
    run = next(r for r in plan.arm_runs if r.arm == arm)
    argv = list(run.argv)
    at = argv.index("--port")
    argv[at + 1] = str(port)
    return [sys.executable if a.endswith("python3") or a.endswith("python") else a for a in argv], dict(run.env)


def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"server not healthy after {timeout:.0f} s")


def prompts(n: int, long_tokens: int) -> list[str]:
    rows = [json.loads(x) for x in (REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl").read_text().splitlines()]
    words = json.loads((REPO / "recipes/data/tokenizer/tokenizer.json").read_text())["model"]["vocab"]
    words = [w for w in words if w.isalpha()]
    rng = random.Random(7)
    out = []
    for i in range(n):
        q = rows[i % len(rows)]["question"]
        prefix = " ".join(rng.choice(words) for _ in range(long_tokens)) + "\n\n" if i % 2 else ""
        out.append(prefix + q)
    return out


def run_arm(arm: str, args, texts: list[str]) -> dict:
    port = 30000 + (arm == "on")
    argv, server_env = arm_server(args.recipe, arm, port)
    if args.dummy_init:
        argv += ["--vattn-dummy-init", args.dummy_init]
    env = {**os.environ, **server_env, "VATTN_COUNTERS_INTERVAL": "2"}
    log = open(args.out / f"{arm}.server.log", "w")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    try:
        wait_healthy(url, proc, args.startup_timeout)
        started = time.time() - t0

        def ask(text):
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0,
                    "max_tokens": args.max_tokens, "ignore_eos": True, "logprobs": args.logprobs}
            choice = post(url + "/v1/chat/completions", body)["choices"][0]
            content = (choice.get("logprobs") or {}).get("content") or []
            return {"output": choice["message"]["content"], "tokens": [c["token"] for c in content] or None,
                    "token_logprobs": [c["logprob"] for c in content] or None}

        t1 = time.time()
        passes = []
        flushed = []
        with ThreadPoolExecutor(args.concurrency) as pool:
            for _ in range(args.repeats):
                # the radix cache emptied first, so that a later pass prefills as the first did (on cached
                # prefixes its extend takes other kernels, and the A/A would measure that too)
                with urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", method="POST"),
                                            timeout=60) as r:
                    flushed.append(r.status == 200)
                passes.append(list(pool.map(ask, texts)))
        served = time.time() - t1
        time.sleep(5)  # one counter interval and more: the last line covers every forward
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    from vattn.sglang.counters import parse_log

    text = (args.out / f"{arm}.server.log").read_text(errors="replace")
    result = {"arm": arm, "env": {k: v for k, v in server_env.items() if k.startswith("VATTN")},
              "dummy_init": args.dummy_init or "the recipe's",
              # one output for every prompt: a model that ignores its context, whose identity proves nothing
              "distinct_outputs": [len({r["output"] for r in p}) for p in passes], "cache_flushed": flushed,
              "startup_s": round(started, 1), "serve_s": round(served, 1),
              "counters": parse_log(text), "cuda_graph_lines": [ln[-160:] for ln in text.splitlines()
                                                                 if "cuda graph" in ln.lower()][:6],
              "vattn_lines": [ln[-200:] for ln in text.splitlines() if "vattn" in ln and "paths" not in ln][:8],
              "passes": passes}
    (args.out / f"{arm}.json").write_text(json.dumps(result, indent=1))
    return result


def compare(a: list[dict], b: list[dict], tok) -> dict:
    """Greedy-output identity and logprob drift of two passes over the same prompts."""
    import pandas as pd

    from analysis.outputs import drift_summary, first_difference, logprob_drift

    firsts = [first_difference(tok.encode(x["output"]).ids, tok.encode(y["output"]).ids) for x, y in zip(a, b)]
    frame = [pd.DataFrame([{"id": i, "repeat": 0, **r} for i, r in enumerate(p)]) for p in (a, b)]
    return {"identical": sum(f is None for f in firsts), "pairs": len(firsts),
            "first_differing_token": [f for f in firsts if f is not None],
            "logprobs": drift_summary(logprob_drift(*frame))}


def across(run_a: Path, run_b: Path, tok) -> dict:
    """Two smoke runs of one recipe, first passes: each arm against the same arm of the other run (the A/A across
    server launches), and each run's off against the other's on."""
    runs = {"A": run_a, "B": run_b}
    passes = {(tag, arm): json.loads((run / f"{arm}.json").read_text())["passes"][0]
              for tag, run in runs.items() for arm in ("off", "on")}
    pairs = {"off A vs off B": (("A", "off"), ("B", "off")), "on A vs on B": (("A", "on"), ("B", "on")),
             "off A vs on B": (("A", "off"), ("B", "on")), "off B vs on A": (("B", "off"), ("A", "on"))}
    return {"runs": {tag: str(run) for tag, run in runs.items()},
            **{name: compare(passes[x], passes[y], tok) for name, (x, y) in pairs.items()}}


def _print_comparison(name: str, cmp: dict) -> None:
    lp = cmp["logprobs"]
    print(f"{name}: greedy outputs identical {cmp['identical']}/{cmp['pairs']} (first differing tokens "
          f"{cmp['first_differing_token']}); logprobs moved {lp['moved']} of {lp['shared']} shared tokens, "
          f"largest change {lp['max_abs']:.3g}")


def _tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(REPO / "recipes/data/tokenizer/tokenizer.json"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="an sglang recipe: each arm's server command and env")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=6000)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompts on each server (>= 2: an A/A)")
    ap.add_argument("--no-logprobs", dest="logprobs", action="store_false",
                    help="do not ask for the chosen tokens' logprobs")
    ap.add_argument("--dummy-init", choices=("sglang", "scaled"), default=None,
                    help="--vattn-dummy-init for both servers (scaled: weights whose answers depend on the prompt, "
                         "so that a kernel change can show; vattn.sglang.dummy_init)")
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--across", type=Path, nargs=2, metavar=("DIR_A", "DIR_B"),
                    help="start nothing: compare two earlier smoke runs' servers into --out/across.json")
    args = ap.parse_args(argv)
    if args.across:
        for run in args.across:
            for arm in ("off", "on"):
                if not (run / f"{arm}.json").is_file():
                    ap.error(f"--across: {run} has no {arm}.json; allowed: the --out folder of a finished smoke run")
        result = across(*args.across, _tokenizer())
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "across.json").write_text(json.dumps(result, indent=1))
        for name, cmp in result.items():
            if name != "runs":
                _print_comparison(name, cmp)
        return 0
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: allowed 1 or more (2 or more also gives each server's A/A)")
    args.out.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.prompts, args.long_tokens)
    arms = [run_arm("on", args, texts), run_arm("off", args, texts)]
    tok = _tokenizer()
    on, off = (a["passes"] for a in arms)
    summary = {"recipe": str(args.recipe), "off_vs_on": compare(off[0], on[0], tok),
               "a_a": {a["arm"]: compare(a["passes"][0], a["passes"][1], tok) for a in arms if len(a["passes"]) > 1},
               "arms": {a["arm"]: {k: a[k] for k in ("env", "dummy_init", "distinct_outputs", "startup_s", "serve_s",
                                                      "counters", "cuda_graph_lines", "vattn_lines")} for a in arms}}
    (args.out / "smoke.json").write_text(json.dumps(summary, indent=1))
    for a in arms:
        c = a["counters"]
        print(f"{a['arm']:>3} {a['env']} dummy init {a['dummy_init']}: {a['distinct_outputs']} distinct outputs "
              f"of {len(texts)} prompts a pass; start {a['startup_s']} s, serve {a['serve_s']} s, "
              f"base {c.get('base_backend')}, vattn {c.get('vattn')}, base {c.get('base')}")
    for name, cmp in [("off vs on", summary["off_vs_on"]), *((f"A/A {k}", v) for k, v in summary["a_a"].items())]:
        _print_comparison(name, cmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
