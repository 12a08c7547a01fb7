"""README.md and docs/ stay true: the configuration page is generated, and links resolve."""

from __future__ import annotations

import re
from pathlib import Path

from dp_governor.api.settings import Settings
from dp_governor.api.settings_doc import DOC_PATH, REGENERATE, render_configuration

ROOT = Path(__file__).resolve().parent.parent

# [text](target) and [text]: target, outside code spans and fenced blocks
_INLINE = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_targets(path: Path) -> list[str]:
    prose = _prose(path.read_text(encoding="utf-8"))
    targets = _INLINE.findall(prose) + _REFERENCE.findall(prose)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown file (lower case, punctuation dropped)."""
    return _anchors_of(path.read_text(encoding="utf-8"))


def _anchors_of(text: str) -> set[str]:
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_configuration_page_is_generated_from_the_settings_model() -> None:
    committed = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert committed == render_configuration(), (
        f"docs/configuration.md differs from the settings model (api/settings.py):"
        f" regenerate it with `{REGENERATE}` and commit the result"
    )


def test_every_setting_is_documented() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not field.description]
    assert not missing, f"give these settings a description in api/settings.py: {missing}"


def test_every_relative_link_points_to_an_existing_file() -> None:
    dangling = []
    for path in _markdown_files():
        if not path.exists():
            continue
        for target in _relative_targets(path):
            file_part, _, anchor = target.split("?", 1)[0].partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                dangling.append(f"{path.relative_to(ROOT)}: {target}")
            elif ROOT not in (resolved, *resolved.parents):
                dangling.append(f"{path.relative_to(ROOT)}: {target} (outside the repository)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                dangling.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not dangling, "dangling links:\n" + "\n".join(dangling)


def test_the_anchor_checker_follows_github_slugs() -> None:
    assert _anchors_of("# Upgrading: schema migrations\n") == {"upgrading-schema-migrations"}
    assert _anchors_of("```\n# not a heading\n```\n## A_b c\n## A_b c\n") == {
        "a_b-c",
        "a_b-c-1",
    }


def test_the_link_checker_sees_links() -> None:
    text = "see [a](docs/a.md#x), `[b](nope.md)`, [c](https://example.org) and\n[d]: e.md\n"
    prose = _prose(text)
    assert _INLINE.findall(prose) == ["docs/a.md#x", "https://example.org"]
    assert _REFERENCE.findall(prose) == ["e.md"]


def test_operations_says_how_a_proxy_keeps_connection_floods_off_the_service() -> None:
    """Over ``DPGOV_LIMIT_CONCURRENCY`` open connections, requests get 503: the proxy's job."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    flood = text[text.index("**Connection floods.**") :]
    for setting in ("limit_conn", "max_conns", "proxy_request_buffering", "--host"):
        assert setting in flood, setting
