"""The command line (`pagedattn.cli`, `python -m pagedattn`): demo, generate, bench-serve and
their option checks.

Each error prints one line on stderr ("pagedattn: error: <message> (hint: ...)") naming the bad
option, never a traceback unless --traceback asks for it; options are checked against each
other before anything runs, and --pages derives from the others when left out. `generate`
streams a completion of the shipped checkpoint; `bench-serve` runs a tiny synthetic workload
and writes its JSON and PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bad_inputs import NOT_INTS, assert_rejected, bad_floats, bad_ints
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedattn
from pagedattn import cli, demo
from pagedattn.errors import InvalidArgumentError, OutOfPagesError

SMALL = ["--requests", "2", "--batch-size", "2", "--max-tokens", "4", "--device", "cpu"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """main(argv) in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse exiting out of main (--help, usage errors)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *names: str) -> None:
    assert code not in (0, None), err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pagedattn: error: "), err
    for name in names:
        assert name in lines[0], err


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0
    assert out == f"pagedattn {pagedattn.__version__}\n"


def test_python_m_pagedattn_version():
    root = str(Path(pagedattn.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, "-m", "pagedattn", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"pagedattn {pagedattn.__version__}\n"


@pytest.mark.parametrize(
    "argv", [["info", "--bogus"], ["demo", "--bogus"], ["demo", "--pages", "x"]]
)
def test_usage_errors_exit_2(argv, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "Traceback" not in err
    assert "error:" in err and argv[-1] in err


BAD_OPTIONS = [
    (["--page-size", "0"], "--page-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--requests", "0"], "--requests"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-tokens", "500"], "--max-tokens"),  # the prompt + 500 pass the 512 positions
    (["--pages", "2"], "--pages"),
    (["--pages", "0"], "--pages"),
    (["--device", "gpu"], "--device"),
    (["--device", "cuda:x"], "--device"),
    (["--device", "cuda:99"], "--device"),  # no CUDA here, or no 100th GPU
    (["--seed", "-1"], "--seed"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--model", "/nonexistent/folder"], "--model"),
]


@pytest.mark.parametrize(("args", "option"), BAD_OPTIONS)
def test_bad_option_is_one_line_naming_it(args, option, capsys):
    code, out, err = run(["demo", "--requests", "2", *args], capsys)
    assert code == 2
    assert_one_line_error(code, err, option, "(hint: ")
    assert "requests" not in out  # checked before anything ran


def test_cuda_asked_but_unavailable(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(["demo", "--requests", "2", "--device", "cuda"], capsys)
    assert code == 2
    assert_one_line_error(code, err, "--device", "CUDA is not available")


def test_pages_too_small_says_what_is_needed(capsys):
    cfg = demo.DemoConfig(num_requests=4, batch_size=2, max_tokens=12)
    longest = demo.longest_prompt(cfg)
    need = demo.pages_for_one(cfg)
    assert need == -(-(longest + 12) // 16)
    assert demo.pages_needed(cfg) == 2 * need
    argv = ["demo", "--requests", "4", "--batch-size", "2", "--max-tokens", "12"]
    code, _, err = run([*argv, "--pages", str(need - 1)], capsys)
    assert_one_line_error(code, err)
    assert (
        f"--pages {need - 1} is too small for one request of {longest + 12} tokens "
        f"({longest} of prompt + --max-tokens 12) at --page-size 16: need at least {need}"
    ) in err


def test_default_pages_derive_from_the_other_options():
    assert demo.DemoConfig().num_pages is None
    cfg = demo.DemoConfig()
    assert demo.pages_needed(cfg) == 16 * demo.pages_for_one(cfg)


def test_page_size_1_just_works(capsys):
    code, out, err = run(["demo", "--page-size", "1", *SMALL], capsys)
    assert code == 0, err
    cfg = demo.DemoConfig(num_requests=2, batch_size=2, max_tokens=4, page_size=1)
    total = demo.pages_needed(cfg)  # derived: 2 requests of (longest prompt + 4) pages of 1
    assert total == 2 * (demo.longest_prompt(cfg) + 4)
    assert "requests" in out and "prefix hit rate" in out
    assert f"/ {total} " in out  # pages used now / peak / total


def test_pages_exactly_needed_works(capsys):
    cfg = demo.DemoConfig(num_requests=2, batch_size=2, max_tokens=4, page_size=7)
    need = demo.pages_for_one(cfg)
    code, out, err = run(["demo", "--page-size", "7", "--pages", str(need), *SMALL], capsys)
    assert code == 0, err  # one request at a time fits; the other waits (or is preempted)
    assert "generated tokens" in out


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield parser.prog, action
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield parser.prog, choice
            for sub in action.choices.values():
                yield from _actions(sub)


def test_every_flag_and_command_has_help(capsys):
    seen = 0
    for prog, action in _actions(cli.build_parser()):
        if isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help and action.help != argparse.SUPPRESS, (prog, action.option_strings)
        seen += 1
    assert seen >= 40
    code, out, _ = run(["demo", "--help"], capsys)
    assert code == 0
    assert "(default: 16)" in out and "(default: 48)" in out  # defaults shown
    for cmd in ("generate", "bench-serve"):
        code, out, _ = run([cmd, "--help"], capsys)
        assert code == 0 and "--model DIR" in out and "(default: 0)" in out


def test_ctrl_c_exits_130_quietly(monkeypatch, capsys):
    def interrupted(cfg, console=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_demo", interrupted)
    code, _, err = run(["demo", *SMALL], capsys)
    assert code == 130
    assert err == ""


def _raise(exc: BaseException):
    def run_demo(cfg, console=None):
        raise exc

    return run_demo


def test_unexpected_error_is_one_line_pointing_at_traceback(monkeypatch, capsys):
    monkeypatch.setattr(demo, "run_demo", _raise(RuntimeError("boom\nsecond line")))
    code, _, err = run(["demo", *SMALL], capsys)
    assert code == 1
    assert_one_line_error(code, err, "RuntimeError: boom second line", "--traceback")


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_flag_shows_the_traceback(where, monkeypatch, capsys):
    monkeypatch.setattr(demo, "run_demo", _raise(RuntimeError("boom")))
    argv = ["--traceback", "demo", *SMALL] if where == "before" else ["demo", "--traceback", *SMALL]
    code, _, err = run(argv, capsys)
    assert code == 1
    assert "Traceback" in err and "RuntimeError: boom" in err


def test_pagedattn_error_from_the_run_has_a_hint(monkeypatch, capsys):
    monkeypatch.setattr(demo, "run_demo", _raise(OutOfPagesError("pool: 0 pages free")))
    code, _, err = run(["demo", *SMALL], capsys)
    assert code == 1
    assert_one_line_error(code, err, "pool: 0 pages free", "(hint: raise --pages")


COUNTS = ["num_requests", "batch_size", "page_size", "max_tokens", "num_pages"]


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(COUNTS), value=bad_ints(1, 2**31 - 1))
def test_demo_config_rejects_bad_counts(field, value):
    if field == "num_pages" and value is None:
        return  # None derives the pool
    cfg = demo.DemoConfig(**{field: value})
    assert_rejected(demo.check_config, cfg, names=f"cfg.{field}")


@settings(max_examples=30, deadline=None)
@given(value=bad_ints(0, 2**63 - 1))
def test_demo_config_rejects_bad_seeds(value):
    assert_rejected(demo.check_config, demo.DemoConfig(seed=value), names="cfg.seed")


@settings(max_examples=30, deadline=None)
@given(value=NOT_INTS | st.sampled_from(["gpu", "CPU", "cuda:", "cuda:-1", "cuda:1x", " cpu"]))
def test_demo_config_rejects_bad_devices(value):
    assert_rejected(demo.check_config, demo.DemoConfig(device=value), names="cfg.device")


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from(["temperature", "top_p"]), value=bad_floats())
def test_demo_config_rejects_bad_floats(field, value):
    assert_rejected(demo.check_config, demo.DemoConfig(**{field: value}), names=f"cfg.{field}")


def test_run_demo_checks_before_running(capsys):
    for cfg, name in [
        (demo.DemoConfig(max_tokens=0), "cfg.max_tokens"),
        (demo.DemoConfig(max_tokens=510), "cfg.max_tokens"),
        (demo.DemoConfig(num_pages=1), "cfg.num_pages"),
        (demo.DemoConfig(page_size=True), "cfg.page_size"),
        (demo.DemoConfig(temperature=-0.5), "cfg.temperature"),
        (demo.DemoConfig(top_p=1.5), "cfg.top_p"),
        (demo.DemoConfig(model="/nonexistent"), "cfg.model"),
    ]:
        err = assert_rejected(demo.run_demo, cfg, names=name)
        assert isinstance(err, InvalidArgumentError)
    assert capsys.readouterr().out == ""


# generate ----------------------------------------------------------------------------------
GEN = ["generate", "--device", "cpu", "--max-tokens", "8", "--temperature", "0"]


def test_generate_streams_the_greedy_completion(capsys):
    code, out, err = run([*GEN, "--prompt", "import os\n"], capsys)
    assert code == 0, err
    from pagedattn.engine import LLM, SamplingParams

    llm = LLM(str(demo.DEFAULT_MODEL), device="cpu", dtype=torch.float32)
    (want,) = llm.generate(["import os\n"], SamplingParams(max_tokens=8, temperature=0))
    assert out == "import os\n" + want.outputs[0].text + "\n"
    assert "tokens" in err and "TTFT" in err
    code, out, err = run([*GEN, "--prompt", "import os\n", "--no-echo"], capsys)
    assert code == 0, err
    assert out == want.outputs[0].text + "\n"
    text = want.outputs[0].text
    at = next(i for i in range(1, len(text) - 1) if text.find(text[i : i + 2]) == i)
    stop = ["never there", text[at : at + 2]]
    code, out, err = run([*GEN, "--prompt", "import os\n", "--no-echo", "--stop", stop[0],
                          "--stop", stop[1]], capsys)  # fmt: skip
    assert code == 0, err
    assert out == text[:at] + "\n"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--prompt", ""], "--prompt"),
        (["--prompt", "x", "--max-tokens", "0"], "--max-tokens"),
        (["--prompt", "x", "--top-p", "2"], "--top-p"),
        (["--prompt", "x", "--top-k", "-2"], "--top-k"),
        (["--prompt", "x", "--model", "/nonexistent"], "--model"),
        (["--prompt", "x", "--device", "tpu"], "--device"),
        (["--prompt", "x", "--stop", ""], "--stop"),
    ],
)
def test_generate_bad_options(args, option, capsys):
    code, out, err = run(["generate", *args], capsys)
    assert code == 2 and out == ""
    assert_one_line_error(code, err, option, "(hint: ")


def test_generate_without_prompt_is_a_usage_error(capsys):
    code, _, err = run(["generate"], capsys)
    assert code == 2 and "--prompt" in err


def test_generate_too_long_a_prompt_has_a_hint(capsys):
    code, _, err = run([*GEN, "--prompt", "x = 1\n" * 400], capsys)
    assert code == 1
    assert_one_line_error(code, err, "max_model_len", "(hint: use a shorter prompt")


# bench-serve -------------------------------------------------------------------------------
BENCH = ["bench-serve", "--device", "cpu", "--requests", "4", "--prompt-mean", "16"]
BENCH += ["--output-mean", "6", "--seed", "1"]


def test_bench_serve_tiny_writes_json_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_json = tmp_path / "sub" / "r.json"
    code, out, err = run([*BENCH, "--out", str(out_json)], capsys)
    assert code == 0, err
    for want in ("output tokens/s", "TTFT p50 / p99", "TPOT p50 / p99", "wrote"):
        assert want in out, out
    res = json.loads(out_json.read_text())
    s = res["summary"]
    assert s["requests"] == 4 and len(res["requests"]) == 4
    assert s["output_tokens"] == sum(r["output_len"] for r in res["requests"])
    assert s["output_tokens_per_s"] > 0 and s["ttft_p99_ms"] >= s["ttft_p50_ms"] > 0
    cfg = demo.BenchConfig(num_requests=4, prompt_mean=16, output_mean=6, seed=1)
    plens, olens = demo.workload_lengths(cfg)
    assert [r["prompt_len"] for r in res["requests"]] == plens.tolist()
    assert [r["output_len"] for r in res["requests"]] == olens.tolist()  # ignore_eos
    png = out_json.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_serve_poisson_arrivals_no_plot(tmp_path, capsys):
    out_json = tmp_path / "r.json"
    argv = [*BENCH, "--request-rate", "50", "--no-plot", "--out", str(out_json)]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    res = json.loads(out_json.read_text())
    assert res["config"]["request_rate"] == 50
    assert not out_json.with_suffix(".png").exists()


def test_bench_serve_without_matplotlib_says_so_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run([*BENCH, "--out", str(tmp_path / "r.json")], capsys)
    assert code == 1
    assert_one_line_error(code, err, "matplotlib", "--no-plot")
    assert "output tokens/s" not in out


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--requests", "0"], "--requests"),
        (["--prompt-mean", "0"], "--prompt-mean"),
        (["--request-rate", "0"], "--request-rate"),
        (["--request-rate", "nan"], "--request-rate"),
        (["--pages", "1"], "--pages"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--model", "/nonexistent"], "--model"),
    ],
)
def test_bench_serve_bad_options(args, option, tmp_path, capsys):
    code, out, err = run([*BENCH, "--out", str(tmp_path / "r.json"), *args], capsys)
    assert code == 2 and out == ""
    assert_one_line_error(code, err, option, "(hint: ")


def test_bench_serve_out_is_a_folder(tmp_path, capsys):
    code, _, err = run([*BENCH, "--out", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "--out", "folder")
