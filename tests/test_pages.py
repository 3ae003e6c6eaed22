"""The pages kpool writes (`kpool diff --html`), opened in a real browser: headless
Chromium (Debian's `chromium`, which .ci/run installs), with the network blocked.
Under CI a missing browser fails the test; elsewhere it skips."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_offline_pages import fetchable, web_urls

ROOT = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# no request can leave: every host name fails to resolve, every proxy is refused
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           "--no-sandbox", "--disable-gpu", "--headless", "--hide-scrollbars",
           "--enable-logging=stderr", "--v=0"]


def browser() -> str:
    if BROWSER is None:
        if CI:
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return BROWSER


def kpool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def open_page(page: Path, tmp: Path) -> tuple[str, str, int]:
    """(the DOM Chromium built, its log, the size of a screenshot of the page)."""
    exe = browser()
    dom = subprocess.run([exe, *OFFLINE, f"--user-data-dir={tmp / 'profile'}",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    shot = tmp / "shot.png"
    subprocess.run([exe, *OFFLINE, f"--user-data-dir={tmp / 'profile'}",
                    "--window-size=1000,1200", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, text=True, timeout=120)
    return dom.stdout, dom.stderr, shot.stat().st_size


def blank_size(tmp: Path) -> int:
    blank = tmp / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    exe = browser()
    shot = tmp / "blank.png"
    subprocess.run([exe, *OFFLINE, f"--user-data-dir={tmp / 'profile'}",
                    "--window-size=1000,1200", f"--screenshot={shot}", blank.as_uri()],
                   capture_output=True, text=True, timeout=120)
    return shot.stat().st_size


@pytest.mark.parametrize(("trace", "base", "head"), [
    ("mtp3-speculative", "rep-once", "tail-truncate"),
    ("shared-prefix-race", "cache-safe", "rep-once"),
])
def test_the_diff_page_opens_offline_with_its_marks_where_the_report_says(
        tmp_path: Path, trace: str, base: str, head: str) -> None:
    page = tmp_path / "d.html"
    r = kpool("diff", f"traces/{trace}.yaml", "--base", base, "--head", head,
              "--html", str(page), "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    html = page.read_text()
    assert fetchable(html) == [] and web_urls(html) == []
    assert "<script" not in html  # the page works with JavaScript off: it has none
    dom, log, size = open_page(page, tmp_path)
    assert "CONSOLE" not in log and "Uncaught" not in log, log[-2000:]
    assert dom.count("<svg") == 6, dom[:500]  # per ubatch and summed, three curves
    assert size > 3 * blank_size(tmp_path)  # curves and text, not a blank page
    # every finding the diff fixed or introduced is a mark at its ubatch
    (t,) = report["traces"]
    want = sorted((d["base"]["index"], code, kind)
                  for d in t["differences"] if d["type"] == "ubatch"
                  for kind, codes in (("introduced", d["findings_gained"]),
                                      ("fixed", d["findings_lost"]))
                  for code in dict.fromkeys(codes))
    got = sorted((int(u), code, kind) for kind, u, code in re.findall(
        r'<circle class="finding (\w+)" data-ubatch="(\d+)"[^>]*><title>(KP\d{3})', dom))
    assert got == want


def test_where_the_sides_are_equal_heads_line_runs_inside_bases(tmp_path: Path) -> None:
    """traces/mtp3-speculative.yaml, rep-once vs tail-truncate: pools marked are equal
    at every ubatch (2 1 1 1 1 1 1 on both sides, the summary's line). Head's line is
    drawn after base's and thinner, so base's still shows around it: a line of one
    width would hide base where they meet, and the page would look like head alone."""
    page = tmp_path / "d.html"
    r = kpool("diff", "traces/mtp3-speculative.yaml", "--base", "rep-once", "--head",
              "tail-truncate", "--html", str(page))
    assert r.returncode == 0, r.stderr
    lines = {label: re.findall(r'<polyline fill="none" stroke="(#\w+)" stroke-width="([\d.]+)"'
                               r'[^>]*points="([^"]*)"', svg)
             for label, svg in re.findall(r'<svg role="img" aria-label="([^"]*)"(.*?)</svg>',
                                          page.read_text())}
    assert len(lines) == 6
    (base, head) = lines["pools marked per ubatch, ubatch 0 to 6"]
    assert base[2] == head[2]  # the same points: equal
    assert (base[0], head[0]) == ("#1f77b4", "#d95f02")  # base first: beneath
    assert float(base[1]) > 2 * float(head[1])


def test_the_race_is_marked_fixed_at_ubatches_1_and_2(tmp_path: Path) -> None:
    """traces/shared-prefix-race.yaml, cache-safe vs rep-once: the KP001 of the two
    ubatches after the seq_cp (ubatches 1 and 2, ops 3 and 6) is fixed."""
    page = tmp_path / "d.html"
    kpool("diff", "traces/shared-prefix-race.yaml", "--base", "cache-safe", "--head",
          "rep-once", "--html", str(page))
    marks = re.findall(r'class="finding (\w+)" data-ubatch="(\d+)"', page.read_text())
    assert sorted(set(marks)) == [("fixed", "1"), ("fixed", "2")]


def test_the_diff_page_marks_findings_at_events_and_where_the_runs_part(
        tmp_path: Path) -> None:
    """partial-copy, cache-safe vs rep-once: the runs part at op 2, a seq_cp rep-once
    aborts (KP005, introduced: red, above, at the op before ubatch 2); cache-safe's
    KP001 and KP002 after it are fixed (green, below) at its ubatch 2. Every change the
    report names is a mark, of its kind and code."""
    page = tmp_path / "d.html"
    r = kpool("diff", "traces/shared-prefix-race.yaml", "traces/partial-copy.yaml",
              "--html", str(page), "--format", "json")
    assert r.returncode == 1, r.stderr
    html = page.read_text()
    circles = re.findall(r'<circle class="finding ([\w ]+)" ([^>]*)><title>(KP\d{3})', html)
    assert ("introduced event", 'data-op="2" data-before="2"', "KP005") in \
        [(k, a.split(" cx=")[0], c) for k, a, c in circles]
    (abort,) = [a for k, a, c in circles if c == "KP005"]
    assert 'fill="#d62728"' in abort
    assert {(k, c) for k, a, c in circles if 'data-ubatch="2"' in a} >= {
        ("fixed", "KP001"), ("fixed", "KP002")}
    (parting,) = set(re.findall(r'<line class="parting" data-op="(\d+)" x1="([\d.]+)"',
                                html))
    assert parting[0] == "2"
    assert f'cx="{parting[1]}"' in abort  # the abort sits where the runs part
    want = sorted((kind, c["code"]) for t in json.loads(r.stdout)["traces"]
                  for kind, key in (("introduced", "findings_introduced"),
                                    ("fixed", "findings_fixed")) for c in t[key])
    got = sorted((k.split()[0], c) for k, a, c in circles)
    assert sorted(set(got)) == sorted(set(want)) and len(got) >= len(want)


def test_the_replay_page_marks_a_finding_of_an_op_in_the_findings_lane(
        tmp_path: Path) -> None:
    """partial-copy under rep-once: the seq_cp aborts (KP005 on the op's event, no
    ubatch has a finding). The findings lane marks it where the op's tick is, linked
    to the op's view, its title naming the code and the op; the lane is not empty."""
    page = tmp_path / "pc.html"
    r = kpool("replay", "traces/partial-copy.yaml", "--engine", "rep-once", "--html",
              str(page), "-o", str(tmp_path / "view.txt"))
    assert r.returncode == 1, r.stderr
    report = json.loads(kpool("replay", "traces/partial-copy.yaml", "--engine", "rep-once",
                              "--format", "json").stdout)
    html = page.read_text()
    assert "no findings" not in html
    marks = re.findall(r'<a href="#([^"]+)"><path class="finding op" data-code="(KP\d{3})" '
                       r'data-op="(\d+)" data-ubatch="(\d+)" d="M([\d.]+) [^"]*"[^>]*>'
                       r"<title>([^<]*)</title>", html)
    want = sorted({(f["code"], e["op"]) for e in report["events"] for f in e["findings"]})
    assert sorted((code, int(op)) for _, code, op, _, _, _ in marks) == want == [("KP005", 2)]
    ((href, _, _, ubatch, x, title),) = marks
    assert href == f"u{ubatch}" and f'id="u{ubatch}"' in html
    assert title.startswith("KP005 engine-abort x1 at op 2 (seq_cp)")
    (tick,) = re.findall(r'<line class="event" data-op="2" x1="([\d.]+)"', html)
    assert tick == x


def test_the_page_draws_the_bright_seq_colours_dark_enough_for_its_white_ground(
        tmp_path: Path) -> None:
    """Sequences 5 to 9 take rich's bright colours (report/view.py `SEQ_STYLES`), which
    its default theme draws at full strength: bright cyan #00ffff, green #00ff00 and
    yellow #ffff00 could not be read on the page's white (a newcomer's walk of 7
    December). The page's views take `text.page_theme`: the same hues, darker."""
    trace = tmp_path / "s8.yaml"
    trace.write_text("kpool_trace: 1\ncache: {kv_size: 64, kpool: 2, n_seq_max: 10}\nops:\n"
                     + "".join(f"  - decode: {{seq: {s}, pos: 0..2}}\n" for s in (5, 6, 7)))
    page = tmp_path / "s8.html"
    r = kpool("replay", str(trace), "--html", str(page), "-o", str(tmp_path / "view.txt"))
    assert r.returncode == 0, r.stderr
    colours = set(re.findall(r"color: (#[0-9a-f]{6})", page.read_text()))
    assert not colours & {"#00ffff", "#00ff00", "#ffff00"}
    assert {"#0082a0", "#008c00", "#967800"} <= colours  # seq 5, 6, 7 as text


@pytest.mark.parametrize("command", ["diff", "replay"])
def test_text_from_the_trace_is_escaped(tmp_path: Path, command: str) -> None:
    """A trace's name and description are data: `<script>` in them is text on the
    page, not a script."""
    src = (ROOT / "traces" / "shared-prefix-race.yaml").read_text()
    evil = tmp_path / "evil.yaml"
    evil.write_text(src.replace("name: shared-prefix-race", 'name: "<script>x()</script>"')
                    .replace("  Two slots share", "  <img src=x onerror=y()> Two slots share"))
    page = tmp_path / "p.html"
    args = (["diff", str(evil), "--base", "cache-safe", "--head", "rep-once"]
            if command == "diff" else ["replay", str(evil), "-o", str(tmp_path / "v.txt")])
    r = kpool(*args, "--html", str(page), cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    html = page.read_text()
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "<img" not in html
    if command == "replay":  # the page shows the description: as text, not a tag
        assert "&lt;img src=x" in html


@pytest.mark.parametrize(("trace", "engine"), [
    ("mtp3-speculative", "rep-once"),
    ("shared-prefix-race", "cache-safe"),
    ("server-session", "cache-safe"),
])
def test_the_replay_page_opens_offline_with_its_marks_where_the_report_says(
        tmp_path: Path, trace: str, engine: str) -> None:
    """`kpool replay T --html FILE`: the timeline marks each finding code at the
    ubatches the JSON report names (one column per ubatch: these traces are short),
    and every ubatch has its view, which the marks link to."""
    page = tmp_path / "out.html"
    r = kpool("replay", f"traces/{trace}.yaml", "--engine", engine, "--html", str(page),
              "-o", str(tmp_path / "view.txt"))
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(kpool("replay", f"traces/{trace}.yaml", "--engine", engine,
                              "--format", "json").stdout)
    html = page.read_text()
    assert fetchable(html) == [] and web_urls(html) == [] and "<script" not in html
    dom, log, size = open_page(page, tmp_path)
    assert "CONSOLE" not in log and "Uncaught" not in log, log[-2000:]
    assert size > 3 * blank_size(tmp_path)
    want = sorted({(f["code"], u["index"]) for u in report["ubatches"] for f in u["findings"]})
    got = sorted({(code, int(u)) for code, u in re.findall(
        r'<circle class="finding" data-code="(KP\d{3})" data-ubatch="(\d+)"', dom)})
    assert got == want
    views = {int(u) for u in re.findall(r'<section class="view" id="u(\d+)"', dom)}
    assert {u["index"] for u in report["ubatches"]} <= views
    assert all(f'href="#u{u}"' in dom for _, u in got)  # each shown: its own view


def test_a_page_of_several_traces_links_each_mark_to_a_view_of_its_own_trace(
        tmp_path: Path) -> None:
    """Two traces on one page: ids are unique, and every link lands on an id."""
    page = tmp_path / "two.html"
    r = kpool("replay", "traces/shared-prefix-race.yaml", "traces/mtp3-speculative.yaml",
              "--html", str(page), "-o", str(tmp_path / "view.txt"))
    assert r.returncode in (0, 1), r.stderr
    html = page.read_text()
    ids = re.findall(r'id="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    links = set(re.findall(r'href="#([^"]+)"', html))
    assert links and links <= set(ids)
    assert {i.split("-")[0] for i in links} == {"t0", "t1"}
