"""The full robustness campaign of `kpool` over hostile inputs.

    python tests/campaign_robustness.py --cases 10000 --seed 1 --jobs 2
    python tests/campaign_robustness.py --repro yaml 1/192     # rerun one case, verbosely

Every case of `tests/hostile.py` (classes bytes, yaml, semantic, report, argv,
settings, special, outputs, options, signals, linebreaks; split by `--weights`) runs
in a process of its own, forked from this one once kpool, numba's cache and the base
reports are loaded: the child sets RLIMIT_AS (`--mem-mb`, default 2048 MB of address
space), sends its stdout and stderr (file descriptors 1 and 2, so a grandchild's
output is caught too) to a file, runs `kpool ARGV` in-process and writes the outcome;
the parent kills its process group when the wall-clock limit passes (`--timeout`,
default 30 s, or the case's own when shorter: 10 s for a special file, so that a read
that waits on a FIFO costs 10 s, not 30). The parent hashes every input before the
fork and judges each outcome with `hostile.judge` (exit 0/1/2 only, or the status the
case must have; no traceback, no "internal error", a message naming the file or the
option for exit 2, no terminal control characters and no raw line breaks, JSON where
asked, no output left by exit 2, no input changed, no plug-in code run) and adds
"timeout" (killed at the limit), "memory" (MemoryError, i.e. over the address-space
limit) and "crash" (died without an outcome).

Case i of class C has the key "<seed>/<i>": the same seed gives the same cases (with
the same kpool and traces). Failing cases are saved to `--out` (default
`robustness-failures/` in the current directory), one directory per case holding
its input files, `case.json`, `outcome.txt` and `repro.sh` (the command, run from
that directory). The table is printed at the end and saved as `table.md`, with
`summary.json` (figures, and the distinct failures grouped by cause).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile

# a fair share each: the eleven classes get 700 to 1,100 cases of 10,000
DEFAULT_WEIGHTS = ("bytes=1,yaml=1.2,semantic=1,report=1,argv=1,settings=1,special=1,"
                   "outputs=1.1,options=1.1,signals=0.8,linebreaks=1")


def split_cases(total: int, weights: dict[str, float]) -> dict[str, int]:
    s = sum(weights.values())
    counts = {c: int(total * w / s) for c, w in weights.items()}
    for c in list(weights)[: total - sum(counts.values())]:
        counts[c] += 1
    return counts


def warm_up() -> None:
    """Load what every child would load: kpool, numba's compiled kernels, the base
    reports (so a fork starts warm and case generation never replays)."""
    with tempfile.TemporaryDirectory() as d:
        o = hostile.run_argv(["replay", str(hostile.TRACES[0]), "--backend", "numba",
                              "-o", f"{d}/w.json", "--format", "json"])
        if o.code not in (0, 1):
            sys.exit(f"campaign: kpool does not run on a shipped trace: {o.stderr}{o.exc}")
    hostile.base_reports()
    hostile.shipped_trees()


def vm_size_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) // 1024
    return 0


# --- one case in a child -------------------------------------------------------------


def child(case: hostile.Case, workdir: Path, raw_path: Path, result_path: Path,
          mem_mb: int) -> None:
    """Runs in the forked child: never returns."""
    try:
        os.setpgid(0, 0)
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        limit = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(workdir)
        o = hostile.run_case(case, workdir, written=True)
        payload = {"code": o.code, "stdout": o.stdout, "stderr": o.stderr, "exc": o.exc,
                   "seconds": o.seconds, "notes": o.notes}
        tmp = result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.rename(result_path)
        code = 0
    except MemoryError:
        code = 99
    except BaseException:  # the harness itself failed: say so on the raw output
        import traceback

        with contextlib.suppress(Exception):
            os.write(2, traceback.format_exc().encode())
        code = 98
    os._exit(code)


class Running:
    def __init__(self, i: int, case: hostile.Case, pid: int, workdir: Path, raw: Path,
                 result: Path, start: float) -> None:
        self.i, self.case, self.pid, self.workdir = i, case, pid, workdir
        self.raw, self.result, self.start = raw, result, start


def finish(r: Running, status: int | None, rusage, timed_out: bool) -> tuple[hostile.Outcome,
                                                                              int]:
    seconds = time.monotonic() - r.start
    raw = ""
    with contextlib.suppress(OSError):
        raw = r.raw.read_bytes()[-200_000:].decode("utf-8", "backslashreplace")
    rss_mb = rusage.ru_maxrss // 1024 if rusage is not None else 0
    if timed_out:
        return hostile.Outcome("timeout", "", "", None, seconds, raw), rss_mb
    if r.result.exists():
        d = json.loads(r.result.read_text())
        return hostile.Outcome(d["code"], d["stdout"], d["stderr"], d["exc"], seconds,
                               raw, d.get("notes", [])), rss_mb
    if status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 99:
        return hostile.Outcome("memory", "", "", None, seconds, raw), rss_mb
    if "MemoryError" in raw:
        return hostile.Outcome("memory", "", "", None, seconds, raw), rss_mb
    how = (f"killed by signal {os.WTERMSIG(status)}" if status is not None
           and os.WIFSIGNALED(status) else f"exit status {status}")
    return hostile.Outcome("crash", "", "", None, seconds, f"{how}\n{raw}"), rss_mb


# --- grouping failures by cause ------------------------------------------------------

_FRAME = re.compile(r'File "[^"]*?(kpool_cli/[^"]+)", line (\d+), in (\S+)')


def signature(kind: str, detail: str) -> str:
    """What distinguishes one cause from another: the exception and the innermost kpool
    frame for an error; the message with numbers, paths and quoted values masked."""
    if kind in ("internal error", "traceback", "memory") and "File" in detail:
        frames = _FRAME.findall(detail)
        last = detail.strip().splitlines()[-1] if detail.strip() else ""
        exc = re.sub(r"\d+", "N", last.split(":")[0])
        where = f"{frames[-1][0]}:{frames[-1][2]}" if frames else "?"
        return f"{kind}: {exc} at {where}"
    d = detail.splitlines()[0] if detail else ""
    d = re.sub(r"/tmp/\S+?/", "DIR/", d)
    if kind in ("input changed", "code run", "not refused", "bad exit status"):
        d = re.sub(r"sha256:[0-9a-f]+", "H", d)
    m = re.match(r"(\w+ holds '[^']*') after: (.*)", d)
    if kind == "escape" and m:  # which stream, which character, after which text
        return f"{kind}: {m[1]} after: {re.sub(r'[0-9]+', 'N', m[2].strip()[:40])}"
    d = re.sub(r"'[^']*'|\"[^\"]*\"", "Q", d)
    d = re.sub(r"\d+", "N", d)
    return f"{kind}: {d[:110]}"


def save_failure(out: Path, r: Running, o: hostile.Outcome, bad: list[tuple[str, str]]) -> Path:
    d = out / f"{r.case.cls}-{r.i:05d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    # inputs and outputs (FIFOs and sockets are not copied: repro.sh makes them again)
    shutil.copytree(r.workdir, d, symlinks=True, dirs_exist_ok=True, ignore=_specials)
    (d / "case.json").write_text(json.dumps(
        {**r.case.to_json(), "failures": [[k, v[:4000]] for k, v in bad]}, indent=2))
    (d / "outcome.txt").write_text(
        f"exit: {o.code!r}\nseconds: {o.seconds:.2f}\n\n--- stdout (last 5000)\n"
        f"{o.stdout[-5000:]}\n--- stderr (last 5000)\n{o.stderr[-5000:]}\n"
        f"--- exception\n{o.exc or ''}\n--- raw fd 1+2 (last 5000)\n{o.raw[-5000:]}\n",
        errors="backslashreplace")
    args = [a.replace(hostile.PH, "./", 1) if a.startswith(hostile.PH)
            else a.replace("=" + hostile.PH, "=./", 1) for a in r.case.argv]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in r.case.env.items())
    if r.case.pythonpath:
        env = (env + " " if env else "") + "PYTHONPATH=\"$PWD\""
    made = "".join(
        f"[ -e {shlex.quote(n)} ] || mkfifo {shlex.quote(n)}\n" if spec == "fifo" else
        f"[ -e {shlex.quote(n)} ] || python -c 'import socket,sys; "
        f"socket.socket(socket.AF_UNIX).bind(sys.argv[1])' {shlex.quote(n)}\n"
        for n, spec in r.case.special.items() if spec in ("fifo", "socket"))
    run = f"{env + ' ' if env else ''}KPOOL_TRACEBACK=1 python -m kpool_cli " + " ".join(
        shlex.quote(a) for a in args)
    if r.case.stdio == "closed":
        run = f"{run} | true"
    elif r.case.stdio == "full":
        run = f"{run} > /dev/full"
    elif r.case.signal:
        sig, delay = r.case.signal
        run = f"timeout -s {signal.Signals(sig).name[3:]} {delay + 1:g} {run}  # +1 s: startup"
    cd = f" && cd {shlex.quote(r.case.cwd)}" if r.case.cwd else ""
    (d / "repro.sh").write_bytes(os.fsencode(
        "#!/bin/sh\n# run from this directory; the same case in-process:\n"
        f"#   python tests/campaign_robustness.py --repro {r.case.cls} {r.case.key}\n"
        + ("# (read-only folders: run it as a user, not root)\n" if r.case.readonly else "")
        + f"cd \"$(dirname \"$0\")\"\n{made}true{cd} && {run}\n"))
    return d


def _specials(folder: str, names: list[str]) -> list[str]:
    """The entries of `folder` that copytree must not open: FIFOs, sockets, devices."""
    out = []
    for n in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, n)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                out.append(n)
    return out


# --- the campaign --------------------------------------------------------------------


def campaign(args) -> int:
    weights = {k: float(v) for k, v in (kv.split("=") for kv in args.weights.split(","))}
    if args.classes:
        weights = {c: weights[c] for c in args.classes.split(",")}
    counts = split_cases(args.cases, weights)
    out = Path(args.out).resolve()
    if out.exists() and args.clean:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    warm_up()
    base_vm = vm_size_mb()
    print(f"campaign: seed {args.seed}, {args.cases} cases {counts}, {args.jobs} jobs, "
          f"{args.timeout:g} s and {args.mem_mb} MB address space per case "
          f"(the warm parent maps {base_vm} MB); warm-up {time.monotonic() - t0:.1f} s",
          file=sys.stderr, flush=True)
    queue = [(cls, i) for cls in counts for i in range(counts[cls])]
    # interleave the classes so progress and timing are even
    queue.sort(key=lambda ci: (ci[1] / max(1, counts[ci[0]]), ci[0]))
    stats: dict[str, Counter] = defaultdict(Counter)
    worst: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "rss_mb": 0, "slowest": ""})
    groups: dict[str, dict] = {}
    scratch = Path(tempfile.mkdtemp(prefix="kpool-campaign-"))
    running: dict[int, Running] = {}
    done = 0
    next_report = time.monotonic() + 30
    try:
        while queue or running:
            while queue and len(running) < args.jobs:
                cls, i = queue.pop(0)
                case = hostile.make_case(cls, f"{args.seed}/{i}")
                wd = scratch / f"{cls}-{i}"
                wd.mkdir()
                hostile.materialize(case, wd)
                case.files = dict.fromkeys(case.files, b"")  # on disk now: a fork stays small
                raw, result = scratch / f"{cls}-{i}.raw", scratch / f"{cls}-{i}.json"
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(case, wd, raw, result, args.mem_mb)
                with contextlib.suppress(OSError):
                    os.setpgid(pid, pid)
                running[pid] = Running(i, case, pid, wd, raw, result, time.monotonic())
            time.sleep(0.002)
            for pid, r in list(running.items()):
                timed_out = False
                wpid, status, rusage = os.wait4(pid, os.WNOHANG)
                if wpid == 0:
                    if time.monotonic() - r.start < min(args.timeout,
                                                        r.case.timeout or args.timeout):
                        continue
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    wpid, status, rusage = os.wait4(pid, 0)
                    timed_out = True
                # a grandchild left behind (a process pool) goes with its group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                del running[pid]
                o, rss = finish(r, status, rusage, timed_out)
                bad = hostile.judge(r.case, o, r.workdir)
                st = stats[r.case.cls]
                st["cases"] += 1
                st[f"exit {o.code}" if o.code in (0, 1, 2) else "exit other"] += 1
                w = worst[r.case.cls]
                if o.seconds >= w["seconds"]:
                    w["seconds"], w["slowest"] = o.seconds, r.case.key
                w["rss_mb"] = max(w["rss_mb"], rss)
                if bad:
                    st["failed"] += 1
                    for kind in dict(bad):
                        st[kind] += 1
                    saved = save_failure(out, r, o, bad)
                    for kind, detail in bad:
                        sig = signature(kind, detail)
                        g = groups.setdefault(sig, {"kind": kind, "count": 0, "classes": Counter(),
                                                    "first": str(saved), "key": r.case.key,
                                                    "cls": r.case.cls, "desc": r.case.desc,
                                                    "detail": detail[:1500]})
                        g["count"] += 1
                        g["classes"][r.case.cls] += 1
                else:
                    st["passed"] += 1
                shutil.rmtree(r.workdir, ignore_errors=True)
                for p in (r.raw, r.result):
                    with contextlib.suppress(OSError):
                        p.unlink()
                done += 1
            if time.monotonic() > next_report:
                next_report = time.monotonic() + 30
                failed = sum(s["failed"] for s in stats.values())
                print(f"campaign: {done}/{args.cases} cases, {failed} failed, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - t0
    table = render(stats, worst, counts, args, elapsed)
    print(table)
    print(render_groups(groups))
    (out / "table.md").write_text(table + "\n" + render_groups(groups) + "\n")
    (out / "summary.json").write_text(json.dumps({
        "command": " ".join(shlex.quote(a) for a in sys.argv), "seed": args.seed,
        "cases": args.cases, "seconds": round(elapsed, 1), "timeout_s": args.timeout,
        "mem_mb": args.mem_mb, "stats": {c: dict(s) for c, s in stats.items()},
        "worst": worst, "groups": {k: {**g, "classes": dict(g["classes"])}
                                   for k, g in groups.items()}}, indent=2))
    return 1 if any(s["failed"] for s in stats.values()) else 0


def render(stats, worst, counts, args, elapsed: float) -> str:
    cols = list(hostile.KINDS)
    head = ("| class | cases | passed | exit 0 / 1 / 2 | " + " | ".join(cols)
            + " | slowest s | peak RSS MB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    total: Counter = Counter()
    for cls in counts:
        s = stats[cls]
        total.update(s)
        w = worst[cls]
        lines.append(f"| {cls} | {s['cases']} | {s['passed']} | {s['exit 0']} / {s['exit 1']} / "
                     f"{s['exit 2']} | " + " | ".join(str(s[c]) for c in cols)
                     + f" | {w['seconds']:.1f} | {int(w['rss_mb'])} |")
    lines.append(f"| **all** | {total['cases']} | {total['passed']} | {total['exit 0']} / "
                 f"{total['exit 1']} / {total['exit 2']} | "
                 + " | ".join(str(total[c]) for c in cols) + " | | |")
    lines.append("")
    lines.append(f"seed {args.seed}, {args.jobs} jobs, {args.timeout:g} s and {args.mem_mb} MB "
                 f"per case: {elapsed:.0f} s in all")
    return "\n".join(lines)


def render_groups(groups: dict) -> str:
    if not groups:
        return "No failures."
    out = ["Distinct failures (by cause), most frequent first:"]
    for sig, g in sorted(groups.items(), key=lambda kv: -kv[1]["count"]):
        classes = ", ".join(f"{c} {n}" for c, n in g["classes"].items())
        out.append(f"- [{g['count']}x; {classes}] {sig}\n    e.g. --repro {g['cls']} {g['key']}"
                   f" ({g['desc'][:120]!r}); saved in {g['first']}")
    return "\n".join(out)


def repro(cls: str, key: str, timeout: float) -> int:
    case = hostile.make_case(cls, key)
    with tempfile.TemporaryDirectory() as d:
        wd = Path(d)
        argv = hostile.materialize(case, wd)
        print(f"case {cls} {key}: {case.desc}\nargv: {argv}\nenv: {case.env}")
        o = hostile.run_case(case, wd, timeout=timeout, written=True)
        print(f"exit {o.code!r} after {o.seconds:.2f} s")
        print("--- stdout\n" + o.stdout[-4000:])
        print("--- stderr\n" + o.stderr[-4000:])
        if o.exc:
            print("--- exception\n" + o.exc)
        bad = hostile.judge(case, o, wd)
        for kind, detail in bad:
            print(f"FAIL {kind}: {detail[:2000]}")
        if not bad:
            print("PASS")
        if os.environ.get("KEEP"):
            keep = Path(os.environ["KEEP"])
            shutil.copytree(wd, keep, dirs_exist_ok=True)
            print(f"files kept in {keep}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", default="1")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    ap.add_argument("--mem-mb", type=int, default=2048, help="address space per case")
    ap.add_argument("--weights", default=DEFAULT_WEIGHTS)
    ap.add_argument("--classes", help="only these classes (comma-separated)")
    ap.add_argument("--out", default="robustness-failures")
    ap.add_argument("--clean", action="store_true", help="empty --out first")
    ap.add_argument("--repro", nargs=2, metavar=("CLASS", "KEY"),
                    help="rerun one case in this process and show everything")
    args = ap.parse_args()
    if args.repro:
        return repro(*args.repro, timeout=args.timeout)
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
