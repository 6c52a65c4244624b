"""Fixtures for the web chat's browser tests: Debian's Chromium driven by Playwright.

- ``browser`` (package scope): one headless Chromium for the browser tests, launched from
  ``/usr/bin/chromium`` (``$MOTUS_CHROMIUM`` overrides it); Playwright never downloads a
  browser. Without it the browser tests are skipped, or fail when ``MOTUS_REQUIRE_BROWSER``
  is set (as ``.ci/run`` does). Its processes and Playwright's driver exist before every
  test starts, so the leak check only sees what a test adds: each test's browser context
  is closed at the end.
- ``open_chat(server, width=..., height=...)``: a fresh browser context with the page at
  ``<server>/ui/``, wrapped in :class:`Chat`. At teardown it fails the test if the page
  requested anything outside the server's origin, threw a JavaScript error, or broke its
  Content-Security-Policy.
- ``example_server`` / ``ui_server``: a real ``motus serve`` running the example agent's
  offline fallback (in a sandbox under the test's folder), or ``tests.agents.ui:agent``;
  ``shared_ui_server`` is that one for a whole module (tests in sessions of their own).

Screenshots go to ``<tmp_path>/screens/NN-name.png``, the test's output folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Locator, Page, Request, expect, sync_playwright

from tests.conftest import Server

CHROMIUM = os.environ.get("MOTUS_CHROMIUM", "/usr/bin/chromium")

#: We run as root (no sandbox) on a machine without network: keep Chromium off it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

EXAMPLE_AGENT = "examples.serving.hitl_agent:agent"
UI_AGENT = "tests.agents.ui:agent"

#: Generous: a turn starts a worker process, and the machine has two cores.
WAIT_MS = 20_000

DESKTOP = (1200, 800)

SESSION_READ = re.compile(r"/sessions/([0-9a-f-]{36})(?:/messages)?(?:\?.*)?$")
PHONE = (390, 844)

expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """One browser for the tests of this package. Not session-wide: while Playwright's sync
    API is alive, the main thread counts as running an asyncio loop, and ``asyncio.run()``
    in any later test would fail with "cannot be called from a running event loop"."""
    if not os.path.exists(CHROMIUM):
        message = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium) or set MOTUS_CHROMIUM"
        if os.environ.get("MOTUS_REQUIRE_BROWSER"):  # set by .ci/run: there, a missing browser is a failure
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Chat:
    """One browser tab on the web chat of ``server``."""

    page: Page
    server: Server
    screens: Path
    requests: list[Request] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Reads of one session (``GET /sessions/{id}[...]``) in flight now, and the most ever. A
    #: reload or navigation cancels the old document's requests, whose failure Playwright may
    #: report after the new document's first read began: a new document starts afresh.
    session_reads: dict[str, set[Request]] = field(default_factory=dict)
    most_concurrent_session_reads: int = 0

    def _started(self, request: Request) -> None:
        self.requests.append(request)
        if request.is_navigation_request() and request.frame is self.page.main_frame:
            self.session_reads.clear()  # a new document: the old one's requests are cancelled
        match = SESSION_READ.search(request.url)
        if match and request.method == "GET":
            reads = self.session_reads.setdefault(match.group(1), set())
            reads.add(request)
            self.most_concurrent_session_reads = max(self.most_concurrent_session_reads, len(reads))

    def _ended(self, request: Request) -> None:
        match = SESSION_READ.search(request.url)
        if match and request.method == "GET":
            self.session_reads.get(match.group(1), set()).discard(request)

    # -- navigation and pictures

    def open(self, session_id: str | None = None) -> Chat:
        self.page.goto(self.server.url + "/ui/" + (f"#/sessions/{session_id}" if session_id else ""))
        expect(self.page.locator("#status")).not_to_have_text("Loading session…")
        return self

    def shot(self, name: str) -> Path:
        """Save a screenshot of the whole page as ``screens/NN-name.png``.

        The file is written here, not by Playwright: given a path, Playwright writes it from
        its event loop's thread pool, whose thread would outlive the test (leak check).
        """
        self.screens.mkdir(parents=True, exist_ok=True)
        path = self.screens / f"{len(list(self.screens.iterdir())):02d}-{name}.png"
        path.write_bytes(self.page.screenshot(full_page=True))
        return path

    @property
    def session_id(self) -> str:
        match = re.search(r"#/sessions/([0-9a-f-]{36})$", self.page.url)
        assert match, f"the URL names no session: {self.page.url}"
        return match.group(1)

    def come_back(self) -> None:
        """Fire the event a browser sends when the user returns to the tab: the page refreshes
        at once instead of at its next periodic refresh (every few seconds)."""
        self.page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")

    # -- the conversation

    def use_key(self, key: str) -> None:
        """Answer the page's API key form with ``key``."""
        self.page.get_by_label("API key", exact=True).fill(key)
        self.page.get_by_role("button", name="Use this key").click()

    def open_with_key(self, key: str, fragment: str = "") -> Chat:
        """Open the web chat at ``#fragment`` (``/sessions/ID``, ``/inbox``) on a keyed
        server, answering its API key form with ``key``."""
        self.page.goto(self.server.url + "/ui/" + (f"#{fragment}" if fragment else ""))
        self.use_key(key)
        return self

    def send(self, text: str) -> None:
        self.page.get_by_label("Message to the agent").fill(text)
        self.page.get_by_role("button", name="Send", exact=True).click()

    def reply(self, text: str) -> Locator:
        """The agent's message bubble containing ``text``."""
        return self.page.locator(".msg.assistant .text", has_text=text)

    def cards(self) -> Locator:
        return self.page.locator("#interrupts article.card")

    def card(self, title: str) -> Locator:
        """The interrupt card whose heading contains ``title``."""
        return self.page.get_by_role("article").filter(has=self.page.get_by_role("heading", name=title))

    def status(self) -> Locator:
        return self.page.get_by_role("status")

    def resume_posts(self) -> list[dict]:
        return [r.post_data_json for r in self.requests if r.method == "POST" and r.url.endswith("/resume")]

    def unlabelled_controls(self) -> list[str]:
        """Visible controls a screen reader could not name (no label, text or aria-label)."""
        return self.page.evaluate(
            """() => [...document.querySelectorAll('button, input, textarea, a[href]')]
                .filter((e) => e.getClientRects().length > 0)
                .filter((e) => {
                  const labels = e.labels ? [...e.labels].map((l) => l.textContent).join('') : '';
                  const by = (e.getAttribute('aria-labelledby') || '').split(' ').filter(Boolean)
                    .map((id) => (document.getElementById(id) || {}).textContent || '').join('');
                  const own = ['BUTTON', 'A'].includes(e.tagName) ? e.textContent : '';
                  return !(labels + by + own + (e.getAttribute('aria-label') || '')).trim();
                })
                .map((e) => e.outerHTML.slice(0, 160))"""
        )


@pytest.fixture
def open_chat(browser: Browser, tmp_path: Path, start_server: Callable[..., Server]) -> Iterator[Callable[..., Chat]]:
    """Factory of :class:`Chat` tabs. It depends on ``start_server`` only so that its tabs
    close before the servers stop (teardown runs in reverse order of setup): a server
    should not have to wait for a browser's open long poll to shut down."""
    contexts: list[BrowserContext] = []
    chats: list[Chat] = []

    def open_chat(server: Server, width: int = DESKTOP[0], height: int = DESKTOP[1], path: str | None = None) -> Chat:
        context = browser.new_context(viewport={"width": width, "height": height}, service_workers="block")
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        chat = Chat(page=page, server=server, screens=tmp_path / "screens")
        page.on("request", chat._started)
        page.on("requestfinished", chat._ended)
        page.on("requestfailed", chat._ended)
        page.on("pageerror", lambda error: chat.problems.append(f"page error: {error}"))

        def console(message: ConsoleMessage) -> None:
            if message.type == "error" and "Failed to load resource" not in message.text:
                chat.problems.append(f"console error: {message.text}")

        page.on("console", console)
        chats.append(chat)
        return chat

    yield open_chat
    for context in contexts:
        context.close()
    for chat in chats:
        outside = [r.url for r in chat.requests if not (r.url.startswith(chat.server.url + "/") or r.url.startswith("data:"))]
        assert not outside, f"the page made requests outside {chat.server.url}: {outside}"
        assert not chat.problems, "\n".join(chat.problems)
        # One request loop per open session: never two reads of the same session at once.
        assert chat.most_concurrent_session_reads <= 1, chat.most_concurrent_session_reads


@pytest.fixture
def example_server(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """The example agent's offline fallback, working in its own sandbox folder."""
    server = start_server(EXAMPLE_AGENT, env={"MOTUS_EXAMPLE_OFFLINE": "1", "MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox")})
    server.extra["sandbox"] = tmp_path / "sandbox"
    return server


#: The keys of ``keyed_example_server``: two people, each with a key of their own.
ALICE_KEY, BOB_KEY = "s3cret-alice", "s3cret-bob"


@pytest.fixture
def keyed_example_server(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """The example agent's offline fallback with two named keys, ``alice`` and ``bob``."""
    return start_server(
        EXAMPLE_AGENT, "--api-key", f"alice={ALICE_KEY}", "--api-key", f"bob={BOB_KEY}",
        env={"MOTUS_EXAMPLE_OFFLINE": "1", "MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox")},
    )


@pytest.fixture
def ui_server(start_server: Callable[..., Server]) -> Server:
    return start_server(UI_AGENT)


@pytest.fixture
def shared_ui_server(shared_server: Callable[..., Server]) -> Server:
    """``ui_server``, one for the module: for tests that each work in a session of their own
    (a new tab's) and look at nothing server-wide (the session list)."""
    return shared_server(UI_AGENT)
