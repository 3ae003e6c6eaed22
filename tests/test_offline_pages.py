"""`kpool replay --svg/--html` write self-contained pages: nothing a browser would
fetch (rich's own SVG template imports Fira Code from a CDN), so a CI artifact or a
bug report shows the same offline; the fonts are a local monospace stack. The SVG is
well-formed XML; the page's links are to its own parts. The README's images
(docs/img) are held to the same. tests/test_pages.py opens the pages in a browser."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from kpool_cli.cli import cli
from kpool_cli.report.text import MONOSPACE, PAGE_PRE, offline_svg_format

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "traces" / "shared-prefix-race.yaml"
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"

# a reference a browser resolves: CSS url(...) and @import, and href / src attributes
# (xlink:href included), whatever the quotes
URL_FN = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)""", re.I | re.S)
IMPORT = re.compile(r"""@import\s+(?:url\(\s*)?(['"]?)([^'")\s;]*)""", re.I)
ATTR = re.compile(r"""(?:^|[\s"'])(?:xlink:)?(href|src)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""",
                  re.I)
SCHEME = re.compile(r"^\s*([a-z][a-z0-9+.-]*):", re.I)


def fetchable(text: str) -> list[str]:
    """Every reference of `text` a browser would fetch: anything but a fragment of the
    page itself (`url(#clip)`) or `data:` (an @import always counts)."""
    found = [m.group(2) for m in URL_FN.finditer(text)]
    found += [m.group(2) or m.group(3) or m.group(4) for m in ATTR.finditer(text)]
    out = [f"@import {m.group(2)}" for m in IMPORT.finditer(text)]
    for ref in found:
        ref = ref.strip()
        scheme = SCHEME.match(ref)
        if ref.startswith("#") or (scheme and scheme.group(1).lower() == "data"):
            continue
        out.append(ref)  # http(s):, file:, //host, or a path next to the page
    return out


def web_urls(text: str) -> list[str]:
    """Every http(s) URL of `text` but the XML namespaces (names, never fetched)."""
    return [u for u in re.findall(r"https?://[^\s\"'<>)]+", text, re.I)
            if u not in (SVG_NS, XLINK_NS)]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("pages")
    svg, html = d / "race.svg", d / "race.html"
    r = CliRunner().invoke(cli, ["replay", str(RACE), "--engine", "cache-safe",
                                 "--svg", str(svg), "--html", str(html)])
    assert r.exit_code == 1, r.output  # the race: a finding
    return svg.read_text(encoding="utf-8"), html.read_text(encoding="utf-8")


def test_the_checker_sees_what_rich_fetches_by_default() -> None:
    c = Console(record=True, width=40, file=io.StringIO())
    c.print("x")
    default_svg = c.export_svg(clear=False)
    assert any("cdnjs" in ref for ref in fetchable(default_svg))
    assert fetchable('<style>@import "a.css";</style>') == ["@import a.css"]
    assert fetchable('<link rel="stylesheet" href="//cdn.example/x.css">')
    assert fetchable("<img src=pic.png>") == ["pic.png"]
    assert fetchable('<a xlink:href="https://x.example/">') == ["https://x.example/"]
    assert fetchable('<g clip-path="url(#c)"><image href="data:image/png;base64,AA"/>') == []


def test_the_templates_fetch_nothing() -> None:
    for fmt in (offline_svg_format(), PAGE_PRE):
        assert fetchable(fmt.replace("{{", "{").replace("}}", "}")) == []
        assert web_urls(fmt) == []
    assert "@font-face" not in offline_svg_format()
    assert f"font-family: {MONOSPACE};" in offline_svg_format()
    assert MONOSPACE.endswith("monospace")


def test_svg_is_self_contained_well_formed_xml(pages: tuple[str, str]) -> None:
    svg, _ = pages
    assert fetchable(svg) == [] and web_urls(svg) == []
    assert "@font-face" not in svg and MONOSPACE in svg
    root = ET.fromstring(svg)  # well-formed, or this raises
    assert root.tag == f"{{{SVG_NS}}}svg"
    texts = "".join(t.text or "" for t in root.iter(f"{{{SVG_NS}}}text")).replace("\xa0", " ")
    assert "KP001" in texts and "x2 race" in texts  # the view itself is there


def test_html_is_self_contained(pages: tuple[str, str]) -> None:
    _, html = pages
    assert fetchable(html) == [] and web_urls(html) == []
    p = _Tags()
    p.feed(html)
    p.close()
    tags = [t for t, _ in p.tags]
    assert "link" not in tags and "script" not in tags and "iframe" not in tags
    for tag, attrs in p.tags:
        for name in ("href", "src"):
            v = attrs.get(name)
            assert v is None or v.startswith(("#", "data:")), (tag, name, v)
    assert "x2 race" in html and "monospace" in html


@pytest.mark.parametrize("image", sorted((ROOT / "docs" / "img").glob("*.svg")),
                         ids=lambda p: p.name)
def test_readme_images_are_self_contained(image: Path) -> None:
    svg = image.read_text(encoding="utf-8")
    assert fetchable(svg) == [] and web_urls(svg) == []
    ET.fromstring(svg)
