"""The sandbox and the adapter, below the graders: limits, forged replies, strict decoding."""
import io
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from graders.engine.failures import LearnerRaised, NotStarted, SandboxFailed
from graders.engine.learner import Foreign, Learner, Remote, _array
from graders.engine.sandbox import Sandbox, Zygote
from graders.engine.worker import MAX_HEADER, encode_frame, parse_frame


ZYGOTES = {}   # one per framework for the whole module: sandboxes after crashes reuse it


@pytest.fixture(scope="module", autouse=True)
def close_zygotes():
    yield
    for zygote in ZYGOTES.values():
        zygote.close()


def learner_for(tmp_path, source, framework="numpy", **limits):
    path = tmp_path / "mod.py"
    path.write_text(source)
    zygote = ZYGOTES.setdefault(framework, Zygote([framework], isolated=None))
    options = dict(framework=framework, module_name="mod", timeout_s=5, import_timeout_s=5, memory_mb=1024)
    sandbox = Sandbox(path, zygote=zygote, **{**options, **limits}).start()
    return Learner(sandbox), sandbox


def test_values_round_trip_with_exact_types(tmp_path):
    learner, sandbox = learner_for(tmp_path, "def echo(*a, **k):\n    return a, k\n")
    with sandbox:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        args, kwargs = learner.echo(x, 1, 2.5, True, None, "s", [1, (2,)], k=np.float64(3.0))
        assert type(args) is tuple and type(args[0]) is np.ndarray and args[0].dtype == np.float32
        assert np.array_equal(args[0], x)
        assert args[1:] == (1, 2.5, True, None, "s", [1, (2,)])
        assert type(args[1]) is int and type(args[3]) is bool
        assert type(kwargs["k"]) is np.float64


def test_torch_tensors_keep_dtype_and_meta_device(tmp_path):
    import torch

    source = "import torch\ndef f(x):\n    return x.to(torch.bfloat16), torch.empty(2, 3, device='meta'), torch.nn.Linear(2, 2)\n"
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        x = torch.randn(3, 4, dtype=torch.float64)
        bf16, meta, module = learner.f(x)
        assert type(bf16) is torch.Tensor and bf16.dtype == torch.bfloat16
        assert torch.equal(bf16, x.to(torch.bfloat16))
        assert meta.device.type == "meta" and meta.shape == (2, 3)
        assert isinstance(module, Remote) and module.type_name == "torch.nn.modules.linear.Linear"
        info = learner.module_info(module)
        assert set(info["parameters"]) == {"weight", "bias"} and info["training"] is True
        module.eval()
        assert learner.get(module, "training") is False


def test_float8_tensors_cross_both_ways_exactly(tmp_path):
    """NumPy has no float8: a float8 tensor crosses as float32 (which holds each of its values)
    and comes back in its own dtype, from the sandbox and to it."""
    import torch

    source = "import torch\ndef f(x):\n    return x.to(torch.float8_e4m3fn), x.to(torch.float8_e5m2)\n" \
             "def g(q):\n    return q.float(), str(q.dtype)\n"
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        x = torch.tensor([0.3, -1.7, 500.0, 2.0 ** -9])
        e4m3, e5m2 = learner.f(x)
        assert e4m3.dtype == torch.float8_e4m3fn and torch.equal(e4m3.float(), x.to(torch.float8_e4m3fn).float())
        assert e5m2.dtype == torch.float8_e5m2 and torch.equal(e5m2.float(), x.to(torch.float8_e5m2).float())
        back, dtype = learner.g(e4m3)
        assert dtype == "torch.float8_e4m3fn" and torch.equal(back, e4m3.float())


def test_tensor_subclass_arrives_as_foreign(tmp_path):
    source = ("import torch\nclass Sly(torch.Tensor):\n    def __eq__(self, other):\n        return True\n"
              "def f(x):\n    return x.as_subclass(Sly)\n")
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        import torch

        assert isinstance(learner.f(torch.zeros(2)), Foreign)


def test_not_implemented_and_exceptions(tmp_path):
    learner, sandbox = learner_for(tmp_path, "def f():\n    raise NotImplementedError\ndef g():\n    return 1 / 0\n")
    with sandbox:
        with pytest.raises(NotStarted, match="f is not implemented yet"):
            learner.f()
        with pytest.raises(LearnerRaised, match="raised ZeroDivisionError: division by zero") as info:
            learner.g()
        assert "line 4, in g: return 1 / 0" in str(info.value.text())


@pytest.mark.serial   # a memory cap, judged with no other test's memory beside it
def test_memory_watch_stops_a_hog_without_the_data_limit(tmp_path):
    source = "import numpy as np\ndef hog():\n    return np.ones(400 * 2**20 // 8 * 4).sum()\n"   # 1.6 GB touched
    learner, sandbox = learner_for(tmp_path, source, memory_mb=700, data_limit=False)
    with sandbox:
        with pytest.raises(SandboxFailed, match="more than the sandbox's 700 MB"):
            learner.hog()


@pytest.mark.serial   # a memory cap, judged with no other test's memory beside it
def test_data_limit_turns_a_hog_into_memory_error(tmp_path):
    learner, sandbox = learner_for(tmp_path, "import numpy as np\ndef hog():\n    return np.ones(10**10)\n", memory_mb=700)
    with sandbox:
        with pytest.raises(LearnerRaised, match="MemoryError"):
            learner.hog()


def test_forged_bytes_on_the_reply_channel_are_a_protocol_error(tmp_path):
    # The reply channel's fd is the worker's to know; learner code can find it all the same.
    source = ("import gc, os\ndef forge():\n"
              "    worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')\n"
              "    os.write(worker.resp_fd, b'\\xff\\xff\\xff\\xff')\n    return 1\n")
    learner, sandbox = learner_for(tmp_path, source)
    with sandbox:
        with pytest.raises(SandboxFailed, match="malformed reply"):
            learner.forge()


def test_forged_frame_with_a_pickle_array_is_refused(tmp_path):
    # A hand-written reply claiming an object array: np.load with allow_pickle=False refuses it.
    blob = io.BytesIO()
    np.save(blob, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        _array(blob.getvalue())
    archive = io.BytesIO()
    np.savez(archive, a=np.zeros(2))
    with pytest.raises(ValueError):
        _array(archive.getvalue())


def test_replies_read_at_once_by_a_rank_groups_threads_never_fail():
    """A rank group's replies are read by one thread per rank. An array's header is read by
    ast.literal_eval, whose construction Python 3.11 tracks in state all threads share: a garbage
    collection in the middle that runs Python code (a __del__) lets another thread in, and one of
    them raises SystemError (CPython gh-106905), a grading error that has nothing to do with the
    learner. The reading is one thread's at a time."""
    import gc
    import threading

    class Cyclic:
        def __del__(self):
            sum(range(50))   # Python code run by the collector: a point where threads switch

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(5, 1, 1)
    blob = io.BytesIO()
    np.save(blob, np.zeros((8, 32, 48)))
    errors = []

    def read():
        for _ in range(3000):
            garbage = Cyclic()
            garbage.itself = garbage
            try:
                _array(blob.getvalue())
            except Exception as exc:
                errors.append(exc)

    try:
        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} reads failed, e.g. {errors[0]!r}"


def test_frames_announcing_huge_sizes_are_refused_before_reading():
    data = encode_frame({"ok": True}, [b"x"])
    forged = (MAX_HEADER + 1).to_bytes(4, "big") + data[4:]
    with pytest.raises(ValueError, match="larger than allowed"):
        parse_frame(io.BytesIO(forged).read)


def test_a_timed_out_worker_is_replaced(tmp_path):
    source = "def slow():\n    while True:\n        pass\ndef fast():\n    return 7\n"
    learner, sandbox = learner_for(tmp_path, source, timeout_s=1)
    with sandbox:
        first_pid = sandbox.proc.pid
        with pytest.raises(SandboxFailed, match="did not finish within 1 s of CPU time"):
            learner.slow()
        assert learner.fast() == 7
        assert sandbox.proc.pid != first_pid


def test_worker_environment_is_scrubbed_and_isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    source = "import os, sys\ndef env():\n    return sorted(os.environ), os.getcwd(), sys.flags.isolated\n"
    learner, sandbox = learner_for(tmp_path, source)
    with sandbox:
        names, cwd, isolated = learner.env()
        assert "PYTHONPATH" not in names and isolated == 1
        # its own private /tmp under bwrap, else an empty folder of its own
        assert cwd == "/tmp" if sandbox.zygote.isolated else "kata-sandbox-" in cwd


def test_closed_stderr_and_a_killing_signal_are_handled(tmp_path):
    # A real fault: the worker is process 1 of its pid namespace, which ignores signals it sends itself.
    source = ("import os\ndef close_and_loop():\n    os.close(2)\n    while True:\n        pass\n"
              "def segfault():\n    import ctypes\n    ctypes.string_at(0)\n")
    learner, sandbox = learner_for(tmp_path, source, timeout_s=1)
    with sandbox:
        started = time.process_time()
        with pytest.raises(SandboxFailed, match="did not finish within 1 s of CPU time"):
            learner.close_and_loop()
        assert time.process_time() - started < 0.5   # waited, did not spin
        with pytest.raises(SandboxFailed, match="killed by SIGSEGV"):
            learner.segfault()


def _busy_loops(cpu, n):
    """``n`` processes that spin on core ``cpu``, each started and pinned there when this returns."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint(flush=True)\nwhile True:\n    pass\n"
    # Each in a session of its own, as sandboxes are: with autogroups, the scheduler shares a core
    # between sessions first.
    loops = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
             for _ in range(n)]
    for loop in loops:
        loop.stdout.readline()
    return loops


@pytest.mark.serial   # four busy loops on a core: other tests' own timings would feel them
def test_a_loaded_machine_costs_no_points(tmp_path):
    # A correct call that does 0.3 s of CPU work (printing a lot) on one core shared with four busy
    # loops gets a fifth of it: about 1.5 s of wall time, past a 1 s limit on the wall clock and
    # well within 1 s of CPU time.
    source = ("import time\ndef work():\n    started = time.process_time()\n"
              "    while time.process_time() - started < 0.3:\n        print('x' * 80)\n    return 7\n")
    learner, sandbox = learner_for(tmp_path, source, timeout_s=1)
    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    with sandbox:
        sandbox.ensure_loaded()
        loops = _busy_loops(cpu, 4)
        try:
            os.sched_setaffinity(sandbox.proc.pid, {cpu})
            os.sched_setaffinity(0, {cpu})
            started = time.monotonic()
            assert learner.work() == 7
            assert time.monotonic() - started > 1   # the wall clock alone would have stopped it
        finally:
            os.sched_setaffinity(0, mine)
            for loop in loops:
                loop.kill()
                loop.wait()


def test_cpu_is_charged_from_the_start_of_each_request(tmp_path):
    # 0.6 s of CPU at import, then 0.3 s, 0.4 s and 0.3 s in calls: each request within its own
    # limit. A thread's time counts once: while it runs, and not again once it has ended.
    # The process's name in /proc/<pid>/stat is the learner's to choose (PR_SET_NAME): read from
    # its first ")", the fields would shift and the CPU times be read from others.
    source = ("import ctypes, threading, time\nctypes.CDLL(None).prctl(15, b') R 0 0 0 0 0 0')\ndef burn(s):\n"
              "    started = time.process_time()\n    while time.process_time() - started < s:\n        pass\n"
              "def in_threads(s):\n    for _ in range(2):\n        t = threading.Thread(target=burn, args=(s / 2,))\n"
              "        t.start()\n        t.join()\nburn(0.6)\n")
    learner, sandbox = learner_for(tmp_path, source, timeout_s=0.5, import_timeout_s=1)
    with sandbox:
        assert learner.burn(0.3) is None
        assert learner.in_threads(0.4) is None
        assert learner.burn(0.3) is None


SPINNERS = {
    "a loop": "def spin():\n    while True:\n        pass\n",
    "a thread": ("import threading\ndef loop():\n    while True:\n        pass\n"
                 "def spin():\n    t = threading.Thread(target=loop)\n    t.start()\n    t.join()\n"),
    # Each thread burns 20 ms and ends between two samples: its time stays its process's.
    "threads that end": ("import threading, time\ndef burn():\n    started = time.thread_time()\n"
                         "    while time.thread_time() - started < 0.02:\n        pass\n"
                         "def spin():\n    while True:\n        t = threading.Thread(target=burn)\n"
                         "        t.start()\n        t.join()\n"),
}


@pytest.mark.parametrize("how", SPINNERS)
def test_endless_work_is_stopped_at_the_cpu_limit(tmp_path, how):
    learner, sandbox = learner_for(tmp_path, SPINNERS[how], timeout_s=0.5)
    with sandbox:
        with pytest.raises(SandboxFailed, match=r"did not finish within 0\.5 s of CPU time"):
            learner.spin()


WAITERS = {
    "sleeps": "import time\ndef wait():\n    while True:\n        time.sleep(1)\n",
    "blocks on a read": "import os\ndef wait():\n    r, w = os.pipe()\n    os.read(r, 1)\n",
    "sleeps at import": "import time\ntime.sleep(60)\ndef wait():\n    pass\n",
}


@pytest.mark.parametrize("how", WAITERS)
def test_code_that_waits_is_stopped_by_the_wall_clock_backstop(tmp_path, how):
    learner, sandbox = learner_for(tmp_path, WAITERS[how], timeout_s=0.4, import_timeout_s=0.4)
    with sandbox:
        started = time.monotonic()
        with pytest.raises(SandboxFailed, match=r"stopped after 2 s of wall-clock time, having used 0\.0 s"):
            learner.wait()
        assert time.monotonic() - started < 4


def test_views_keep_their_strides_and_module_calls_are_recorded(tmp_path):
    import torch

    source = ("import torch\ndef layout(x):\n    return x.is_contiguous(), list(x.stride()), x.clone()\n"
              "def attend(x):\n    m = torch.nn.MultiheadAttention(4, 2, batch_first=True)\n    return m(x, x, x)[0]\n")
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        base = torch.randn(2, 3, 5, 4)
        view = base.transpose(1, 2)
        contiguous, strides, values = learner.layout(view)
        assert contiguous is False and strides == list(view.stride()) and torch.equal(values, view)
        assert learner.layout(base)[0] is True
        with learner.recording() as ops:
            learner.attend(torch.randn(2, 3, 4))
        modules = [op["name"] for op in ops if op["kind"] == "module"]
        assert modules[0] == "MultiheadAttention"
        from graders.engine.structure import banned_in_ops
        assert banned_in_ops(ops, ["torch.nn.MultiheadAttention"]) == ["torch.nn.MultiheadAttention"]


def test_measure_times_calls_from_the_trusted_clock(tmp_path):
    import torch

    source = ("import time\ntime.perf_counter = lambda: 0.0   # a lie about time changes nothing\n"
              "def slow(x):\n    time.sleep(0.05)\n    return x\n")
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        # Three measures: on a loaded machine one request can wait for a core, which the
        # difference of two requests' times then takes off one of them.
        measured = [learner.measure(learner.slow, torch.zeros(3), repeats=4) for _ in range(3)]
        seconds = sorted(m["seconds"] for m in measured)
        assert 0.045 < seconds[-1] and seconds[0] < 0.2
        assert all(m["peak_bytes"] is None for m in measured) or torch.cuda.is_available()


def test_value_mismatch_shows_the_same_row_of_got_and_expected():
    from graders.engine import expect
    from graders.engine.failures import CheckFailed

    expected = np.zeros((2, 3, 4))
    got = expected.copy()
    got[1, 2, 3] = 5.0
    with pytest.raises(CheckFailed) as info:
        expect.array(got, expected, call="f(x)", rtol=1e-7, atol=1e-12)
    assert "row [1, 2, :] = [0. 0. 0. 5.]" in info.value.got
    assert "row [1, 2, :] = [0. 0. 0. 0.]" in info.value.expected


def test_measure_sends_the_arguments_once_before_the_timed_requests(tmp_path):
    """Sending a large input (and decoding it) costs more than many fast calls, and varies: the
    timed requests must not carry it, or its jitter is what they measure. Every call sees the
    very object the sandbox decoded once."""
    import torch

    source = "seen = []\ndef fast(x):\n    seen.append(id(x))\n    return x\ndef ids():\n    return sorted(set(seen))\n"
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        learner.measure(learner.fast, torch.zeros(4 << 20), repeats=3)
        assert len(learner.ids()) == 1


def test_measure_times_calls_faster_than_a_requests_own_cost(tmp_path):
    """A call of 0.2 ms, asked 5 times: 1 ms in all, under the jitter of a request. The calls are
    repeated until they stand out of it, and their time is not lost in it (0 s)."""
    import torch

    source = "import time\ndef fast(x):\n    time.sleep(0.0002)\n    return x\n"
    learner, sandbox = learner_for(tmp_path, source, framework="torch")
    with sandbox:
        seconds = sorted(learner.measure(learner.fast, torch.zeros(3), repeats=5)["seconds"] for _ in range(3))
    assert 0.0002 <= seconds[1] < 0.002, seconds
