"""Does a real-sized model fine-tune inside a slice? Peak memory against the slice, per case.

    python benchmarks/fit_slice.py [--case 1.5b] [--case 7b] [--smoke] [--json-out FILE]

Cases (the seed's rule, "0.5-1.5B LoRA fits 1g.6gb; 7B QLoRA needs 2g.12gb"):

- ``1.5b``: a ~1.5B Llama/Qwen2.5-shaped model (``scratch`` preset ``llama-1.5b``, random
  init), LoRA with bf16 weights and gradient checkpointing, inside 5.75 GiB (``1g.6gb``).
- ``7b``: a ~7B Llama-2-shaped model (preset ``llama-7b``), 4-bit QLoRA through bitsandbytes,
  inside 11.5 GiB (``2g.12gb``). Without bitsandbytes the case says so and is not run.

Each case builds the model directory in one process (on the GPU: a 7B init on a CPU takes
minutes; the directory goes to /dev/shm when it has room, as writing ~13.5 GB to disk is slow)
and trains it in another, through the trainer's Python API (what ``draslice train
--model-dir ... --slice-memory-gib N --json`` runs; the API hands back the result object and
the config it ran, which the report needs), with the slice emulated by the
per-process CUDA memory cap (``trainer/device.py``). The cap makes the allocator fail at the
slice size as a MIG slice would, so a case that finishes stayed inside it.

PASS: training finished under the cap and the peak reserved memory is within the slice
(``budget.fits`` with no headroom). Also printed: whether it keeps ``budget.py``'s default
headroom (what ``draslice advise`` recommends by) and the device-level peak seen by the driver
(``cudaMemGetInfo``: it includes the CUDA context, which a real MIG slice also pays for).

``--smoke`` runs the same code paths on the CPU with the ``tiny-llama`` preset and no cap (a
cap needs CUDA; the 7B case still loads its base in 4 bits, which bitsandbytes >= 0.50 does on
the CPU): it proves the plumbing, it measures nothing about fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shutil
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from draslice.benchmarks.childproc import kill_children_on_term, run_child, write_json

GIB = 1024**3
LEARNING_RATE = 2e-4
WARMUP_STEPS = 2


@dataclass(frozen=True)
class FitCase:
    name: str
    preset: str
    profile: str
    slice_memory_gib: float
    load_in_4bit: bool
    approx_params: float  # for the directory size (bf16: 2 bytes each)
    batch_size: int = 2
    max_length: int = 512
    steps: int = 6
    smoke: bool = False

    @property
    def dir_bytes(self) -> float:
        return self.approx_params * 2


CASES = {
    "1.5b": FitCase("1.5b", "llama-1.5b", "1g.6gb", 5.75, False, 1.54e9),
    "7b": FitCase("7b", "llama-7b", "2g.12gb", 11.5, True, 6.74e9),
}


def case_for(name: str, smoke: bool) -> FitCase:
    case = CASES[name]
    if not smoke:
        return case
    # No cap on a CPU (it needs CUDA); 4-bit stays. Same calls, tiny model.
    return replace(case, preset="tiny-llama", slice_memory_gib=0.0,
                   approx_params=1e6, max_length=64, steps=3, smoke=True)


def bitsandbytes_available() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def model_home(need_bytes: float, work: Path) -> Path:
    """/dev/shm when it has 1.3x the room (RAM: the ~13.5 GB of a 7B is written and read
    back in seconds), else the work folder on disk."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 1.3 * need_bytes:
            return Path(tempfile.mkdtemp(prefix="draslice-fit-", dir=shm))
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="draslice-fit-", dir=work))


# ----------------------------------------------------------------------------------------
# Child: build the model directory.


def child_build(case: FitCase, model_dir: Path, data_path: Path, device: str) -> dict:
    from draslice.tests.scratch import save_preset, write_demo_data

    start = time.perf_counter()
    save_preset(case.preset, model_dir, device=device)
    built = time.perf_counter() - start
    write_demo_data(data_path, "prompt-completion", n=1024)
    size = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
    return {"build_seconds": built, "dir_gib": size / GIB, "model_dir": str(model_dir)}


# ----------------------------------------------------------------------------------------
# Child: train it under the cap.


class DevicePeak:
    """Samples device-wide used memory (cudaMemGetInfo) in a thread: the driver's view,
    CUDA context and all, which is what a MIG slice's memory must also hold."""

    def __init__(self, interval_s: float = 0.05) -> None:
        import torch

        self.torch = torch
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        free, total = self.torch.cuda.mem_get_info()
        self.peak = max(self.peak, total - free)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> DevicePeak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# SFTConfig fields the cases set, by their ``draslice train`` flag names.
REQUIRED_FIELDS = ("model_dir", "data", "max_length", "pack", "gradient_checkpointing",
                   "bf16_weights", "load_in_4bit", "lora_targets", "slice_memory_gib")


def sft_config(case: FitCase, model_dir: Path, data_path: Path, device: str):
    from draslice.trainer.config import SFTConfig

    known = {f.name for f in dataclasses.fields(SFTConfig)}
    missing = [f for f in REQUIRED_FIELDS if f not in known]
    if missing:
        raise SystemExit(
            f"error: draslice.trainer.config.SFTConfig has no field(s) {missing}: this draslice "
            "predates real-model training (issue 6); install a build that has it"
        )
    values = dict(
        model_dir=str(model_dir), data=str(data_path), max_length=case.max_length, pack=True,
        gradient_checkpointing=True, bf16_weights=not case.smoke, load_in_4bit=case.load_in_4bit,
        lora_targets="auto", slice_memory_gib=case.slice_memory_gib, batch_size=case.batch_size,
        steps=case.steps, log_every=1, device=device,
        # A pretrained model's LoRA rate (the finetune component's default) with a warm-up, as
        # a user fine-tunes a real model, not the synthetic run's 3e-3.
        learning_rate=LEARNING_RATE, warmup_steps=WARMUP_STEPS,
    )
    return SFTConfig(**{k: v for k, v in values.items() if k in known})


def child_train(case: FitCase, model_dir: Path, data_path: Path, device: str) -> dict:
    import torch

    from draslice.errors import DrasliceError, SliceOutOfMemory
    from draslice.trainer import budget
    from draslice.trainer import device as dev
    from draslice.trainer.sft import train

    cfg = sft_config(case, model_dir, data_path, device)
    on_cuda = torch.cuda.is_available() and device != "cpu"
    if case.load_in_4bit:
        try:
            import bitsandbytes  # noqa: F401  (installed is not enough: its CUDA libs must load)
        except Exception as err:  # any failure at all means: 4-bit cannot be measured
            return {"finished": False, "not_run": f"bitsandbytes does not import here: {err}"}
    out: dict = {"config": {k: v for k, v in dataclasses.asdict(cfg).items()
                            if not isinstance(v, dict)}}
    probe = DevicePeak() if on_cuda else None
    with tempfile.TemporaryDirectory(prefix="fit-out-") as tmp, probe or nullcontext():
        start = time.perf_counter()
        try:
            result = train(cfg, Path(tmp) / "out", Path(tmp) / "metrics.jsonl", log=print)
            out.update(result=result.to_dict(), finished=True)
        except (DrasliceError, torch.OutOfMemoryError) as err:  # OOM in the slice is one
            out.update(finished=False, error=f"{type(err).__name__}: {err}",
                       out_of_memory=isinstance(err, (SliceOutOfMemory, torch.OutOfMemoryError)))
            print(f"error: {err}")
        out["seconds"] = time.perf_counter() - start
    peak = dev.peak_memory_bytes(torch.device("cuda" if on_cuda else "cpu")) / GIB
    out["peak_reserved_gib"] = round(peak, 3)
    out["peak_device_used_gib"] = round(probe.peak / GIB, 3) if probe else None
    cap = case.slice_memory_gib
    out["within_cap"] = bool(out["finished"] and cap and budget.fits(peak, cap, headroom=0.0))
    out["keeps_default_headroom"] = bool(out["finished"] and cap and budget.fits(peak, cap))
    return out


# ----------------------------------------------------------------------------------------
# Parent: one case end to end.


def run_case(case: FitCase, device: str, timeout_s: float, work: Path) -> dict:
    record: dict = {"case": case.name, "preset": case.preset, "profile": case.profile,
                    "slice_memory_gib": case.slice_memory_gib, "load_in_4bit": case.load_in_4bit,
                    "batch_size": case.batch_size, "max_length": case.max_length,
                    "steps": case.steps, "smoke": case.smoke}
    if case.load_in_4bit and not bitsandbytes_available():
        record.update(status="NOT RUN", why="bitsandbytes is not importable here: 4-bit QLoRA "
                      "cannot be measured (install the bitsandbytes wheel)")
        return record
    home = model_home(case.dir_bytes, work)
    record["model_storage"] = str(home.parent)
    try:
        script = str(Path(__file__).resolve())
        common = ["--case", case.name, "--model-dir", str(home / "model"),
                  "--data", str(home / "data.jsonl"), "--device", device]
        common += ["--smoke"] if case.smoke else []
        built = run_child([sys.executable, script, "--child", "build", *common,
                           "--json-out", str(home / "build.json")], home / "build.json",
                          timeout_s, prefix=f"[fit {case.name}/build] ")
        if not built.ok:
            why = "timed out" if built.timed_out else f"exit {built.returncode}"
            record.update(status="ERROR", why=f"building the model dir {why}")
            return record
        record["build"] = built.result
        trained = run_child([sys.executable, script, "--child", "train", *common,
                             "--json-out", str(home / "train.json")], home / "train.json",
                            timeout_s, prefix=f"[fit {case.name}/train] ")
        if trained.result is None:
            why = "timed out" if trained.timed_out else f"exit {trained.returncode}"
            last = (trained.tail.strip().splitlines() or [""])[-1]
            record.update(status="ERROR", why=f"training {why}: {last[:300]}")
            return record
        result = trained.result
        if "not_run" in result:
            record.update(status="NOT RUN", why=result["not_run"])
            return record
        record["train"] = result
        if not result["finished"] and not result.get("out_of_memory"):
            record["status"] = "ERROR"  # the run broke for another reason than memory
        elif case.smoke:
            record["status"] = "RAN (smoke: no cap, fit not judged)"
        else:
            record["status"] = "PASS" if result["within_cap"] else "FAIL"
        return record
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _weights(record: dict) -> str:
    if record["load_in_4bit"]:
        return "bf16 compute" + (" (smoke)" if record["smoke"] else "")
    return "fp32 weights (smoke)" if record["smoke"] else "bf16 weights"


def report(record: dict) -> str:
    head = (f"fit {record['case']} ({record['preset']}, "
            f"{'4-bit QLoRA' if record['load_in_4bit'] else 'LoRA'}, "
            f"{_weights(record)}, "
            f"grad checkpointing, batch {record['batch_size']} x {record['max_length']} tokens) "
            + (f"standing in for {record['profile']}" if record["smoke"] else
               f"in {record['profile']} = {record['slice_memory_gib']} GiB")
            + f": {record['status']}")
    if "why" in record:
        return f"{head} -- {record['why']}"
    t = record["train"]
    res = t.get("result") or {}
    if record["smoke"]:
        memory = (f"  peak memory {t['peak_reserved_gib']:.2f} GiB (CPU RSS; no cap on a CPU, "
                  "fit not judged)")
    else:
        memory = (f"  peak reserved {t['peak_reserved_gib']:.2f} GiB of the "
                  f"{record['slice_memory_gib']} GiB cap; keeps budget.py's default headroom: "
                  f"{t['keeps_default_headroom']}; device-level peak (CUDA context included): "
                  f"{t['peak_device_used_gib']} GiB")
    lines = [head, memory,
             f"  model dir {record['build']['dir_gib']:.2f} GiB built in "
             f"{record['build']['build_seconds']:.0f} s ({record['model_storage']}); training "
             f"{t['seconds']:.0f} s"]
    if res:
        lines.append(f"  trainable {res.get('trainable_params'):,} of {res.get('total_params'):,}"
                     f" params; {res.get('tokens_per_s', 0):,.0f} tokens/s; "
                     f"loss {res.get('initial_loss', 0):.3f} -> {res.get('final_loss', 0):.3f}")
    if "error" in t:
        lines.append(f"  {t['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Fine-tune a ~1.5B model (LoRA) in 1g.6gb and a ~7B model (QLoRA) in "
        "2g.12gb under an emulated slice; print peak memory vs the slice and PASS/FAIL.",
    )
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="which case (repeatable; default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model on the CPU, no cap: the same code paths")
    parser.add_argument("--device", default=None,
                        help="default: cuda (cpu with --smoke)")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="per process (building a case's model, training it): one still "
                        "running after this many seconds is killed and reported "
                        "(default %(default).0f)")
    parser.add_argument("--work-dir", default=None,
                        help="where model dirs go when /dev/shm is too small (default: tmp)")
    parser.add_argument("--json-out", help="write the results JSON here")
    parser.add_argument("--child", choices=("build", "train"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = args.device or ("cpu" if args.smoke else "cuda")
    names = args.case or list(CASES)

    if args.child:
        case = case_for(names[0], args.smoke)
        model_dir, data = Path(args.model_dir), Path(args.data)
        if args.child == "build":
            payload = child_build(case, model_dir, data, "cpu" if args.smoke else device)
        else:
            payload = child_train(case, model_dir, data, device)
        write_json(args.json_out, payload)
        return

    kill_children_on_term()
    work = Path(args.work_dir or tempfile.gettempdir())
    work.mkdir(parents=True, exist_ok=True)
    out: dict = {"bitsandbytes": bitsandbytes_available(), "cases": {}}
    if not out["bitsandbytes"]:
        print("bitsandbytes: not importable here; the 4-bit QLoRA case cannot be measured")
    for name in names:
        record = run_case(case_for(name, args.smoke), device, args.timeout_s, work)
        out["cases"][name] = record
        print(report(record), flush=True)
        if args.json_out:
            write_json(args.json_out, out)


if __name__ == "__main__":
    main()
