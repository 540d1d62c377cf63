"""peer_trainers' tables from results alone: the ratios against Unsloth and HF Trainer, the
verdict on issue 39's bar (met, or by how much not), the long-sequence table with what
stopped the longest, and which tensor a failed allocation is the size of."""

from __future__ import annotations

import pytest

from draslice.benchmarks import peer_trainers as pt


def _run(tps: float, peak: float, **extra) -> dict:
    return {"batch": 8, "tokens_per_s": tps, "peak_reserved_gib": peak, "run_s": 30.0,
            "fits": True, **extra}


def _summary(ours: dict, unsloth: dict, hf: dict | None = None) -> dict:
    peers = {"ours-offload": {"runs": {"1g.6gb": ours}},
             "unsloth": {"runs": {"1g.6gb": unsloth}}}
    if hf is not None:
        peers["hf"] = {"runs": {"1g.6gb": hf}}
    return {"shape": "qwen2.5-1.5b", "seq": 2048, "caps": ["1g.6gb"], "warmup": 3,
            "steps": 10, "peak_tflops": None, "peers": peers}


def test_ratio_is_speed_then_memory_and_empty_where_either_did_not_train():
    assert pt.ratio(_run(36_000, 5.0), _run(30_000, 5.5)) == "1.20x at 0.91x memory"
    assert pt.ratio(_run(36_000, 5.0), {"batch": 8, "oom": True, "error": "x"}) == ""
    assert pt.ratio(_run(36_000, 5.0), {**_run(1, 9.0), "fits": False}) == ""


def test_the_table_has_a_column_for_each_reference_and_a_verdict_line():
    lines = pt.table(_summary(_run(36_000, 5.0, first_step_s=20.0, process_s=40.0),
                              _run(30_000, 5.5, first_step_s=55.0, process_s=80.0),
                              hf={"batch": 8, "oom": True, "error": "OutOfMemoryError: x",
                                  "fits": False}))
    header = lines[2]
    assert "vs HF Trainer" in header and "vs Unsloth" in header and "first step" in header
    ours = next(line for line in lines if line.startswith("| draslice SFT loop"))
    assert "1.20x at 0.91x memory" in ours and "20.0 s" in ours and "40.0 s" in ours
    verdicts = [line for line in lines if line.startswith("- ")]
    assert ("- ours-offload, 1g.6gb: >= 1.2x Unsloth at <= its memory: MET "
            "(1.20x at 0.91x memory; first step 20.0 s / 55.0 s, whole process 40.0 s / "
            "80.0 s)") in verdicts
    assert "- ours-offload, 1g.6gb: HF Trainer + peft did not train here; ours did" in verdicts


@pytest.mark.parametrize(("ours", "unsloth", "says"), [
    (_run(33_000, 5.0), _run(30_000, 5.5), "NOT MET (1.10x, short of 1.2x by 8%)"),
    (_run(40_000, 6.0), _run(30_000, 5.5), "NOT MET (1.09x its memory)"),
    (_run(30_000, 6.0), _run(30_000, 5.5), "NOT MET (1.00x, short of 1.2x by 17%, 1.09x its "
                                           "memory)"),
])
def test_a_missed_target_says_by_how_much(ours, unsloth, says):
    lines = pt.verdicts(_summary(ours, unsloth))
    assert any(says in line for line in lines), lines


def test_a_failed_allocation_is_named_by_the_tensor_it_is_the_size_of():
    shape = pt.SHAPES["qwen2.5-1.5b"]
    seq = 32768
    mlp = seq * shape.ffn * 2 / 1024**3
    assert pt.name_allocation(shape, seq, mlp).startswith("the MLP's intermediate")
    logits = seq * shape.vocab * 4 / 1024**3
    assert pt.name_allocation(shape, seq, logits).startswith("logits through the head")
    assert pt.name_allocation(shape, seq, 0.001) == ""


def test_asked_gib_is_read_through_the_loops_own_oom_message():
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 560.00 MiB. GPU 0 ...")
        except RuntimeError as inner:
            raise ValueError("out of memory inside the slice: ...") from inner
    except ValueError as err:
        assert pt.asked_gib(err) == pytest.approx(560 / 1024)
    assert pt.asked_gib(ValueError("no size here")) is None


def test_the_long_table_gives_each_length_the_longest_and_what_stopped_it():
    fail = {"batch": 1, "seq": 32768, "oom": True, "fits": False,
            "error": "SliceOutOfMemory: out of memory inside the slice",
            "asked_gib": 32768 * 8960 * 2 / 1024**3}
    summary = {"shape": "qwen2.5-1.5b", "seqs": [16384, 32768], "caps": ["1g.6gb"], "long": {
        "ours-tiled": {"1g.6gb": {"16384": _run(24_000, 4.3), "32768": _run(20_000, 5.2)}},
        "unsloth": {"1g.6gb": {"16384": _run(20_000, 4.6), "32768": fail}}}}
    lines = pt.long_table(summary)
    assert any("| 1g.6gb | 16,384 | draslice SFT loop + offload_activations + tile_mlp | "
               "24,000 | 4.30 | 1.20x at 0.93x memory |" in line for line in lines)
    assert "| 1g.6gb | 32,768 | Unsloth | out of memory | | | |" in lines
    assert "- ours-tiled, 1g.6gb: longest that trains 32,768" in lines
    stopped = next(line for line in lines if line.startswith("- unsloth"))
    assert stopped.startswith("- unsloth, 1g.6gb: longest that trains 16,384; at 32,768: ")
    assert "(that allocation is the MLP's intermediate activation" in stopped


def test_long_steps_time_at_least_the_long_tokens():
    class Args:
        steps, long_tokens = 3, 131072
    assert [pt.long_steps(s, Args) for s in (4096, 8192, 16384, 32768, 65536)] == [
        32, 16, 8, 4, 3]
