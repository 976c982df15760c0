"""The blog example's pages in a real headless browser (Debian's chromium): the DOM the
browser builds from each page shows the exact counts, and the chart page renders to an
image. The pages are served by Django's live server from the test database."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from blog.models import Article, Comment, Tag, User
from django.core.cache import cache
from django.db.models import Count, Q

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# a closed network: no background connections, no first-run work
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


def _browse(*args: str) -> str:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make test` installs Debian's chromium package")
    with tempfile.TemporaryDirectory(prefix="browser-") as profile:
        done = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dom(url: str) -> str:
    return _browse("--dump-dom", url)


def _cells(html: str, row_class: str, cell_class: str) -> dict[int, int]:
    rows = re.findall(rf'<tr class="{row_class}" data-id="(\d+)">(.*?)</tr>', html, flags=re.DOTALL)
    out = {}
    for pk, body in rows:
        found = re.search(rf'<td class="n {cell_class}">(-?\d+)</td>', body)
        assert found is not None, body
        out[int(pk)] = int(found.group(1))
    return out


def _seed() -> tuple[list[Article], list[Tag]]:
    cache.clear()
    ann, bob, cid = User.objects.bulk_create(User(username=n) for n in ("ann", "bob", "cid"))
    tags = Tag.objects.bulk_create(Tag(name=n) for n in ("sql", "django"))
    articles = Article.objects.bulk_create(
        [Article(title="x", author=ann), Article(title="y", author=bob)]
    )
    articles[0].tags.add(*tags)
    articles[1].tags.add(tags[0])
    Comment.objects.bulk_create(
        [Comment(article=articles[0], creator=cid, publish_status="public") for _ in range(3)]
        + [Comment(article=articles[1], creator=cid, publish_status="public") for _ in range(5)]
        + [Comment(article=articles[1], creator=ann) for _ in range(2)]  # private
    )
    return articles, tags


def test_the_pages_show_the_exact_counts_in_a_browser(live_server: object) -> None:
    articles, tags = _seed()
    base = str(live_server)

    authors = _cells(_dom(f"{base}/authors/"), "author", "exact")
    truth = dict(
        User.objects.filter(articles__isnull=False)
        .annotate(
            n=Count("articles__comments", filter=Q(articles__comments__publish_status="public"))
        )
        .values_list("pk", "n")
    )
    assert authors == truth == {articles[0].author_id: 3, articles[1].author_id: 5}

    shown_tags = _cells(_dom(f"{base}/tags/"), "tag", "exact")
    assert shown_tags == {tags[0].pk: 2, tags[1].pk: 1}

    page = _dom(f"{base}/articles/{articles[1].pk}/detail/")
    assert '<strong id="exact">5</strong>' in page
    bars = re.findall(r'<rect class="bar" data-day="([\d-]+)" data-value="(\d+)"', page)
    assert len(bars) == 14
    assert sum(int(v) for _, v in bars) == 5


def _png_size_and_colours(data: bytes) -> tuple[tuple[int, int], int]:
    """Width and height of a PNG, and how many distinct byte values its pixels hold."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return (width, height), len(set(zlib.decompress(idat)))


def test_the_chart_page_renders_to_an_image(live_server: object, tmp_path: Path) -> None:
    articles, _ = _seed()
    shot = tmp_path / "activity.png"
    _browse(
        f"--screenshot={shot}",
        "--window-size=900,700",
        f"{live_server}/articles/{articles[1].pk}/activity/?days=14",
    )
    size, values = _png_size_and_colours(shot.read_bytes())
    assert size == (900, 700)
    assert values > 16  # text, axes and bars drawn, not a blank page
