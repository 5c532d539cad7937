"""The run summary (python -m advpt.report) on hand-written metrics files: the edge cases."""

import json
import math
import subprocess
import sys

import pytest
from matplotlib import pyplot

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.errors import ReportError
from advpt.report import main
from advpt.training.reporting.plots import comparison_figure, run_figure
from advpt.training.reporting.run_metrics import load_run, read_rows
from advpt.training.reporting.summary import compare_runs, format_duration, report_run, summarize
from tests.helpers import IN_AND_OUT_OF_PROCESS, REPO, child_env


def _write_run(run_dir, rows, mode="adversarial", tail=""):
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(parse(TrainConfig, ["--mode", mode]).to_dict()))
    text = "".join(json.dumps(r) + "\n" for r in rows) + tail
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def _train(step, enc, noi, phase, elapsed, adv=3.0, rnd=2.9, tokens_per_s=100.0):
    row = {"step": step, "encoder_step": enc, "noiser_step": noi, "phase": phase,
           f"{phase}_loss": 3.0, "random_loss": rnd, "tokens_per_s": tokens_per_s,
           "time": 1.7e9 + elapsed, "elapsed_s": elapsed}  # fmt: skip
    if adv is not None:
        row |= {"adversarial_loss": adv, "mask_entropy": 0.9, "option_mask_share": 0.8,
                "option_keep_share": 0.1, "option_replace_share": 0.1}  # fmt: skip
    return row


def _val(step, enc, loss, elapsed):
    return {"step": step, "encoder_step": enc, "val_loss": loss, "time": 1.7e9 + elapsed,
            "elapsed_s": elapsed}  # fmt: skip


def _resumed_adversarial_run(tmp_path):
    """Two jobs: the second restarted its clock after step 4 (a resume)."""
    rows = [
        _train(2, 0, 2, "noiser", 10.0, adv=3.5, rnd=3.4),
        _train(4, 2, 2, "encoder", 20.0, adv=3.2, rnd=3.1, tokens_per_s=300.0),
        _val(4, 2, 3.05, 25.0),
        _train(6, 2, 4, "noiser", 5.0, adv=3.6, rnd=3.3, tokens_per_s=300.0),  # job 2 starts
        _train(8, 4, 4, "encoder", 15.0, adv=2.6, rnd=2.8),
        _val(8, 4, 3.10, 18.0),
    ]
    return _write_run(tmp_path / "adv", rows, tail='{"step": 9, "pha')  # killed mid-line


def test_summary_of_a_resumed_adversarial_run(tmp_path):
    s = summarize(load_run(_resumed_adversarial_run(tmp_path)))
    assert s.wall_s == pytest.approx(25.0 + 18.0) and s.jobs == 2
    assert (s.steps, s.encoder_steps, s.noiser_steps) == (8, 4, 4)
    assert s.best_val == (3.05, 2) and s.final_val == (3.10, 4)
    # the noiser-phase rows are left out: the encoder's view of its positions
    assert s.adversarial_loss == pytest.approx(2.6) and s.random_loss == pytest.approx(2.8)
    # windows of 10 s each (the third spans the resume) at 100, 300, 300 and 100 tokens/s
    assert s.tokens_per_s == pytest.approx(200.0)


def test_the_plots_of_a_run_stand_on_the_encoder_step_axis_as_the_trackers_do(tmp_path):
    figure = run_figure(load_run(_resumed_adversarial_run(tmp_path)))
    loss = figure.axes[0]
    encoder, noiser, validation = (line.get_xdata().tolist() for line in loss.get_lines())
    assert (encoder, noiser, validation) == ([2, 4], [0, 2], [2, 4])  # not the steps 4, 8
    assert {axes.get_xlabel() for axes in figure.axes} == {"encoder step"}
    pyplot.close(figure)


NOISER_PANELS = ["Loss at adversarial vs random positions (encoder steps)",
                 "Where and how the noiser masks"]  # fmt: skip


def _titles(figure) -> list[str]:
    titles = [axes.get_title() for axes in figure.axes]
    pyplot.close(figure)
    return titles


def test_a_run_without_a_noiser_gets_no_noiser_panels(finished_run, tmp_path):
    """A real random-MLM run (the default setting's kind): its picture is the MLM loss and the
    throughput, with no empty noiser panel and no random positions' loss (its MLM loss again);
    an adversarial run keeps all four; a run whose mode is unknown is judged by its rows."""
    run = load_run(finished_run)
    assert run.mode == "random" and not run.has_noiser
    figure = run_figure(run)
    assert _titles(figure) == ["MLM loss", "Throughput (tokens/s)"]
    report_run(finished_run)
    assert (finished_run / "report.png").read_bytes()[:4] == b"\x89PNG"
    adversarial = load_run(_resumed_adversarial_run(tmp_path))
    assert _titles(run_figure(adversarial)) == ["MLM loss", *NOISER_PANELS, "Throughput (tokens/s)"]
    for run_dir in (finished_run, adversarial.path):
        (run_dir / "config.json").unlink()
    assert not load_run(finished_run).has_noiser and load_run(adversarial.path).has_noiser
    # side by side, only the adversarial run has lines of positions
    positions = comparison_figure([run, adversarial], ["rnd", "adv"]).axes[3]
    assert [line.get_label() for line in positions.get_lines()] == ["adv adversarial", "adv random"]
    positions = comparison_figure([run], ["rnd"]).axes[3]
    assert not positions.get_lines() and positions.texts[0].get_text() == "no run here has a noiser"
    pyplot.close("all")


def test_report_text_and_plot_of_one_run(tmp_path):
    run_dir = _resumed_adversarial_run(tmp_path)
    text = report_run(run_dir)
    assert "43s of training in 2 jobs" in text
    assert "8 optimizer steps: 4 encoder + 4 noiser" in text
    assert "best val loss    3.0500 at encoder step 2" in text
    assert "final val loss   3.1000 at encoder step 4" in text
    assert "adversarial 2.6000, random 2.8000: the noiser's positions are easier" in text
    assert text.splitlines()[-2] == (  # the cut last line is left out, and said
        "  skipped          metrics.jsonl line 7: cut short (being written, or its job was "
        "killed while writing it)"
    )
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # with the data's unigram entropy, the line under the validation losses reads it against them
    lines = report_run(run_dir, plots=False, unigram=3.2).splitlines()
    final = lines.index("  final val loss   3.1000 at encoder step 4")
    assert lines[final + 1] == (
        "  unigram entropy  3.2000 nats, the val loss of a model that ignores context: "
        "the final val loss is 0.100 below it"
    )


def test_random_run_without_validation_or_timestamps(tmp_path):
    rows = [_train(s, s, 0, "encoder", s, adv=None, tokens_per_s=tps)
            for s, tps in ((1, 200.0), (2, 100.0), (3, 200.0))]  # fmt: skip
    for row in rows:
        del row["time"], row["elapsed_s"]
    run_dir = _write_run(tmp_path / "rnd", rows, mode="random")
    text = report_run(run_dir)
    assert "3 encoder optimizer steps" in text
    assert "wall time        - (metrics.jsonl has no timestamps)" in text
    assert "best val loss    -" in text
    assert "context\n" in report_run(run_dir, plots=False, unigram=2.8)  # no val loss to compare
    assert "random 2.9000 (only one kind of position in this run)" in text
    assert "tokens/s         167" in text  # the plain mean of 200, 100, 200 without timestamps
    assert (run_dir / "report.png").is_file()  # the loss and the throughput: no noiser's panels


def test_comparison_table_and_plot(tmp_path, capsys):
    adv = _resumed_adversarial_run(tmp_path)
    rnd = _write_run(tmp_path / "rnd", [_train(4, 4, 0, "encoder", 9.0, adv=None),
                                        _val(4, 4, 2.9, 12.0)], mode="random")  # fmt: skip
    assert main([str(adv), str(rnd)]) == 0  # no --out: the table only, and how to write it
    printed = capsys.readouterr().out
    assert "| adv | adversarial | 43s | 4 | " in printed
    assert "\n\n- adv: skipped metrics.jsonl line 7: cut short" in printed  # under the table
    assert "| rnd | random | 12s | 4 | 100 | 2.9000 (4) | 2.9000 (4) | - / 2.9000 |" in printed
    assert "pass --out DIR" in printed and not (tmp_path / "cmp").exists()
    text = compare_runs([str(adv), str(rnd)], str(tmp_path / "cmp"))
    assert (tmp_path / "cmp" / "comparison.md").read_text().strip() in text
    assert (tmp_path / "cmp" / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    piped = _write_run(tmp_path / "lr|1e-3", [_val(4, 4, 2.9, 12.0)], mode="random")
    assert "\n| lr\\|1e-3 | random | " in compare_runs([str(piped), str(rnd)], None)  # one row


def test_run_directories_with_nothing_to_report_are_one_sentence(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "missing/metrics.jsonl does not exist" in capsys.readouterr().err
    assert main([str(_write_run(tmp_path / "empty", []))]) == 2
    assert capsys.readouterr().err.endswith("empty/metrics.jsonl holds no metrics yet\n")
    garbage = _write_run(tmp_path / "garbage", [], tail="\x00" * 64 + "\n[1, 2]\n{}\n{oops")
    assert main([str(garbage)]) == 2
    assert capsys.readouterr().err == (
        f"advpt: error: {garbage}/metrics.jsonl holds no metrics (metrics.jsonl line 1: not "
        "JSON; metrics.jsonl line 2: not a JSON object; metrics.jsonl line 3: no 'step'; "
        "metrics.jsonl line 4: cut short (being written, or its job was killed while writing "
        "it))\n"
    )


def test_damaged_rows_are_left_out_and_said(tmp_path):
    """Each row a summary cannot use is left out, naming its line and why; the rest is reported."""
    good = [_train(1, 1, 0, "encoder", 1.0), _val(1, 1, 3.0, 2.0)]
    damaged = [
        {**good[0], "step": "2"}, {**good[0], "step": True}, {**good[1], "val_loss": "low"},
        {**good[0], "encoder_step": -1}, {**good[0], "phase": 7}, {**good[0], "elapsed_s": 1e999},
        {**good[0], "time": 1e300}, {"step": 3, "val_loss": 2.0},
    ]  # fmt: skip
    run_dir = _write_run(tmp_path / "damaged", [*good, *damaged])
    with (run_dir / "metrics.jsonl").open("ab") as metrics:  # a byte that is no UTF-8: not JSON
        metrics.write(b'{"step": 4, "phase": "encoder\xff\n' + b"[" * 100_000 + b"\n")
    run = load_run(run_dir)
    assert [{k: v for k, v in row.items() if k != "wall_s"} for row in run.rows] == good
    assert run.skipped == [
        "metrics.jsonl lines 3, 4: 'step' is not a whole number",
        "metrics.jsonl line 5: 'val_loss' is not a number",
        "metrics.jsonl line 6: 'encoder_step' is not a whole number",
        "metrics.jsonl line 7: 'phase' is not a string",
        "metrics.jsonl line 8: 'elapsed_s' is not finite",
        "metrics.jsonl line 9: 'time' is not a Unix time",
        "metrics.jsonl line 10: no 'encoder_step'",
        "metrics.jsonl lines 11, 12: not JSON",
    ]
    text = report_run(run_dir)
    assert "final val loss   3.0000 at encoder step 1" in text
    assert "  skipped          metrics.jsonl lines 11, 12: not JSON" in text.splitlines()


def test_the_rows_a_tool_reads_back_from_a_run_it_made(tmp_path):
    """``read_rows`` (the scripts' reader): every row as written, NaN too, but a last line cut
    short; any other line that is not JSON is an error naming its line."""
    rows = [_train(1, 1, 0, "encoder", 1.0), {**_val(1, 1, 3.0, 2.0), "val_loss": math.nan}]
    run_dir = _write_run(tmp_path / "run", rows, tail='{"step": 2, "phase"')
    read = read_rows(run_dir)
    assert len(read) == 2 and read[0] == rows[0] and math.isnan(read[1]["val_loss"])
    assert read_rows(tmp_path / "not yet", missing_ok=True) == []
    with pytest.raises(ReportError, match="does not exist"):
        read_rows(tmp_path / "not yet")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step\n{"step": 3}\n')
    with pytest.raises(ReportError, match=r"metrics.jsonl line 2 is not JSON$"):
        read_rows(run_dir)


@IN_AND_OUT_OF_PROCESS
def test_a_damaged_config_json_leaves_the_mode_unknown_and_says_why(tmp_path, run):
    """``config.json`` cut short (or not text, or without a mode): the numbers are reported, the
    mode is unknown, and a line says why."""
    run_dir = _resumed_adversarial_run(tmp_path)
    config = run_dir / "config.json"
    config.write_text(config.read_text()[:40])
    done = run([str(run_dir), "--no_plots"], module="advpt.report")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "run adv (unknown)"
    assert "  best val loss    3.0500 at encoder step 2" in lines
    assert lines[-1].startswith("  skipped          config.json is not JSON (Unterminated string")
    assert lines[-1].endswith("), so the mode is unknown")
    config.write_bytes(b"\xff\xfe{")
    assert load_run(run_dir).skipped[-1] == "config.json is not UTF-8 text, so the mode is unknown"
    for no_mode in ("[]", '{"method": 3}', '{"method": {"mode": null}}'):
        config.write_text(no_mode)
        assert load_run(run_dir).skipped[-1] == "config.json names no mode, so the mode is unknown"


def test_without_matplotlib_the_numbers_still_print(tmp_path):
    run_dir = _resumed_adversarial_run(tmp_path)
    hide = "import sys; sys.modules['matplotlib'] = None; from advpt.report import main; "
    result = subprocess.run(
        [sys.executable, "-c", hide + f"sys.exit(main([{str(run_dir)!r}]))"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "best val loss    3.0500" in result.stdout
    assert result.stdout.strip().endswith("(plots need matplotlib: pip install advpt[plots])")
    assert not (run_dir / "report.png").exists()


def test_durations_read_like_a_clock():
    assert [format_duration(s) for s in (None, 4.4, 62, 3 * 3600 + 5)] == [
        "-", "4s", "1m 02s", "3h 00m 05s",
    ]  # fmt: skip


def test_the_mode_of_a_run_written_before_the_method_section(tmp_path):
    run_dir = _write_run(tmp_path / "old", [_train(1, 1, 0, "encoder", 1.0)])
    assert load_run(run_dir).mode == "adversarial"
    (run_dir / "config.json").write_text(json.dumps({"run": {"mode": "random"}}))
    assert load_run(run_dir).mode == "random"


@IN_AND_OUT_OF_PROCESS
def test_nan_and_infinite_losses_are_no_best_loss_and_are_said(tmp_path, run):
    """JSON's ``NaN`` and ``Infinity`` (a diverged run logs them) are left out, value by value:
    the best validation loss is the lowest finite one, and the summary says what was left out."""
    rows = [
        _train(1, 1, 0, "encoder", 1.0), _val(1, 1, math.nan, 2.0),
        {**_train(2, 2, 0, "encoder", 3.0), "encoder_loss": math.inf}, _val(2, 2, 3.1, 4.0),
        _val(3, 3, -math.inf, 5.0), _val(4, 4, 3.2, 6.0),
    ]  # fmt: skip
    run_dir = _write_run(tmp_path / "diverged", rows)
    assert "NaN" in (run_dir / "metrics.jsonl").read_text()  # as json.dumps writes them
    done = run([str(run_dir), "--no_plots"], module="advpt.report")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "  best val loss    3.1000 at encoder step 2" in lines
    assert "  final val loss   3.2000 at encoder step 4" in lines
    assert "  steps            4 encoder optimizer steps" in lines  # the rows themselves stay
    assert lines[-2:] == [
        "  skipped          metrics.jsonl lines 2, 5: 'val_loss' is NaN or infinite (only that "
        "value is left out)",
        "  skipped          metrics.jsonl line 3: 'encoder_loss' is NaN or infinite (only that "
        "value is left out)",
    ]
    assert run_figure(load_run(run_dir)) is not None  # and the plot draws the finite points
