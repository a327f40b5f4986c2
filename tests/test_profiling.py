"""The timeline profile's idle-time reports (sft/dev/timeline.py::gaps_report with Python stacks,
light_report without), on traces of known gaps and on a real trace of torch's profiler (its event format,
which the reports read)."""

import torch

from sft.dev.timeline import gaps_report, light_report


def _py(pid, name, ts, dur, parent):
    return {"ph": "X", "cat": "python_function", "name": name, "tid": 7, "ts": ts, "dur": dur,
            "args": {"Python id": pid, "Python parent id": parent}}


def test_idle_gpu_time_is_charged_to_what_the_host_ran():
    step = "/site/deepspeed/runtime/engine.py(2400): step"
    loss = "/site/trl/trainer/sft_trainer.py(1642): compute_loss"
    events = [
        _py(1, "train.py(10): <module>", 0, 1000, None),
        _py(2, "/site/deepspeed/runtime/engine.py(2100): forward", 0, 400, 1),
        _py(3, loss, 100, 300, 2),
        _py(4, "<built-in method item of Tensor object at 0x7f00>", 200, 200, 3),
        _py(5, step, 500, 500, 1),
        {"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "tid": 7, "ts": 200, "dur": 200},
        # kernels: busy 0-200, idle 200-400 (the host in .item()), busy 400-600, idle 600-900 (in step)
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "tid": 0, "ts": 0, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "triton_fused_adam", "tid": 0, "ts": 400, "dur": 200},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "tid": 0, "ts": 900, "dur": 100},
    ]
    text = gaps_report({"traceEvents": events})
    assert "GPU busy 0.0005 s, idle 0.0005 s in 2 gaps" in text
    assert "matmul 0.0002" in text and "copies 0.0001" in text
    assert "step 0.0003, forward 0.0002" in text
    lines = text.splitlines()
    assert "0.0003 s  60.0%  deepspeed/runtime/engine.py(2400): step" in lines[lines.index(
        "idle by the innermost named Python frames the host was in (top 30):") + 1]
    # the builtin is named after the library frames, its address dropped
    assert ("0.0002 s  40.0%  deepspeed/runtime/engine.py(2100): forward > trl/trainer/sft_trainer.py(1642): "
            "compute_loss > <built-in method item of Tensor object>") in text
    assert "0.0002 s  40.0%  aten::_local_scalar_dense" in text


def test_torch_profilers_own_trace_is_read(tmp_path):
    """On CPU the trace has Python stacks and no kernel: the report says so instead of failing."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        x = torch.randn(32, 32)
        (x @ x).sum().item()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    import json

    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("cat") == "python_function" and "Python parent id" in e["args"] for e in trace["traceEvents"])
    assert gaps_report(trace).startswith("no GPU activity")


def test_during_the_backward_the_idle_time_is_autograds_threads():
    """The main thread waits in run_backward while autograd's thread runs the hooks: the thread that entered
    its innermost frame last is the one charged."""
    hook = "/site/deepspeed/runtime/zero/stage_1_and_2.py(1368): grad_handling_hook"
    events = [
        _py(1, "/site/deepspeed/runtime/engine.py(3381): backward", 0, 1000, None),
        _py(2, "<built-in method run_backward of torch._C._EngineBase object>", 10, 990, 1),
        {**_py(3, hook, 300, 400, None), "tid": 8},
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "tid": 0, "ts": 0, "dur": 300},
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "tid": 0, "ts": 700, "dur": 300},
    ]
    text = gaps_report({"traceEvents": events})
    assert "idle 0.0004 s in 1 gaps" in text
    assert "0.0004 s 100.0%  deepspeed/runtime/zero/stage_1_and_2.py(1368): grad_handling_hook" in text


def test_without_stacks_the_idle_time_is_charged_to_the_phase_and_host_op_and_the_longest_gaps_are_named():
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "sft.forward", "tid": 7, "ts": 0, "dur": 400},
        {"ph": "X", "cat": "user_annotation", "name": "sft.step", "tid": 7, "ts": 500, "dur": 500},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 7, "ts": 0, "dur": 150},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 7, "ts": 250, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_foreach_mul_", "tid": 7, "ts": 600, "dur": 300},
        # busy 0-200, idle 200-400 (forward: no host op 150 us, a launch 50 us), busy 400-600, idle
        # 600-900 (step, in the foreach op)
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "tid": 0, "ts": 0, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "triton_fused_adam", "tid": 0, "ts": 400, "dur": 200},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "tid": 0, "ts": 900, "dur": 100},
    ]
    text = light_report({"traceEvents": events})
    assert "GPU busy 0.0005 s, idle 0.0005 s in 2 gaps" in text
    assert "phases on the host: forward 0.0-0.4 ms, step 0.5-1.0 ms" in text
    assert "idle by the engine's phase the host was in: step 0.0003, forward 0.0002" in text
    assert "0.0003 s  60.0%  aten::_foreach_mul_" in text and "0.0001 s  30.0%  (no host op)" in text
    assert "0.0001 s  10.0%  cudaLaunchKernel" in text  # 50 us of the forward's 200
    gaps = text.splitlines()[text.splitlines().index(
        "the 15 longest gaps: at (ms into the window), length, phase, host op; kernel before / after") + 1:]
    assert gaps[0].split() == ["0.60", "0.300", "ms", "step", "aten::_foreach_mul_", "triton_fused_adam", "/",
                               "Memcpy", "DtoH"]
    assert gaps[1].split()[:6] == ["0.20", "0.200", "ms", "forward", "(no", "host"]
    assert light_report({"traceEvents": events[:5]}).startswith("no GPU activity")

    # a profile started a step early: the GPU still runs the previous step's work (launched before the trace) when
    # the step's host events begin, so the time before its first recorded kernel is not idle
    late = [dict(e, ts=100, dur=100) if e["name"] == "nvjet_gemm" else e for e in events]
    assert "idle 0.0006 s in 3 gaps" in light_report({"traceEvents": late})
    queued = light_report({"traceEvents": late}, queued=True)
    assert "window 0.0009 s from the step's first kernel" in queued and "idle 0.0005 s in 2 gaps" in queued
