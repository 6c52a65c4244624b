"""The approvals workflow in the web chat (issue 13): live events, the live turn seen by an
approver elsewhere, the inline record of each decision, numbered concurrent cards, safe
Markdown, and the Inbox across sessions."""

from __future__ import annotations

from datetime import datetime

import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until

pytestmark = pytest.mark.browser

CALLS_AGENT = "tests.agents.approval:calls"


def _ms(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


def open_inbox(open_chat, server, cards: int):  # noqa: ANN001, ANN201
    """A tab on the Inbox view of ``server`` once it shows ``cards`` cards: (chat, its list)."""
    chat = open_chat(server)
    chat.page.goto(server.url + "/ui/#/inbox")
    inbox = chat.page.locator("#inbox-list")
    expect(inbox.locator("article.card")).to_have_count(cards)
    return chat, inbox


def wait_streaming(chat) -> None:  # noqa: ANN001
    """Until the view's event stream has answered (from then on it hears every change)."""
    wait_until(lambda: any(r.url.endswith("/events") and r.response() is not None for r in chat.requests), what="the view's event stream")


def test_an_approver_elsewhere_sees_the_turn_above_the_card(open_chat, example_server):
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    expect(chat.card("Approve this tool call?")).to_be_visible()

    # Another browser context: no sessionStorage of the sender, only the server's view.
    other = open_chat(example_server).open(chat.session_id)
    card = other.card("Approve this tool call?")
    expect(card).to_be_visible()
    user = other.page.locator(".msg.user .text", has_text="delete the old logs file")
    expect(user).to_be_visible()
    call = other.page.locator(".msg.assistant .tool-call.live", has_text="delete_file")
    expect(call).to_be_visible()
    expect(call.locator("pre")).to_contain_text('"path": "old_logs.txt"')
    # In that order: the message, the tool call, then the card.
    assert user.bounding_box()["y"] < call.bounding_box()["y"] < card.bounding_box()["y"]
    other.shot("approver-context")


def test_a_turn_that_ends_between_the_session_read_and_the_messages_read_shows_once(open_chat, example_server):
    """The page reads the session (a live turn), then its messages. When the turn ends between
    the two, the messages hold the turn's stored messages while the session still shows its
    steps: rendered together, the user's message and the agent's words showed twice (seen in
    the suite as two "Deleted old_logs.txt" replies). The turn's ``history_at`` tells the page;
    it reads again instead. Here the ordering is arranged: one real read of the waiting
    session is held until the turn has ended (approved by another client), then delivered."""
    chat = open_chat(example_server).open()
    chat.send("delete the old logs file")
    expect(chat.card("Approve this tool call?")).to_be_visible()
    sid = chat.session_id
    waiting = example_server.get(f"/sessions/{sid}").json()
    assert waiting["turn"]["history_at"] == len(example_server.get(f"/sessions/{sid}/messages").json())
    # The most copies of the user's message (or of the agent's reply) ever on the page at once.
    chat.page.evaluate(
        """() => {
          window.mostCopies = 0;
          const count = () => {
            const user = [...document.querySelectorAll(".msg.user .text")].filter((e) => e.textContent.includes("delete the old logs file")).length;
            const reply = [...document.querySelectorAll(".msg.assistant .text")].filter((e) => e.textContent.includes("Deleted old_logs.txt")).length;
            window.mostCopies = Math.max(window.mostCopies, user, reply);
          };
          count();
          new MutationObserver(count).observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
        }"""
    )
    held = []

    def hold_one_waiting_read(route):
        response = route.fetch()
        if held or response.json().get("status") != "interrupted":
            route.fulfill(response=response)
            return
        held.append(route.request.url)
        (pending,) = response.json()["interrupts"]
        answered = example_server.post(
            f"/sessions/{sid}/resume", json={"interrupt_id": pending["interrupt_id"], "value": {"approved": True}}
        )
        assert answered.status_code == 200, answered.text
        wait_until(lambda: example_server.get(f"/sessions/{sid}").json()["status"] == "idle", what="the turn to end")
        route.fulfill(response=response)  # the session as it was: still waiting, its turn live

    chat.page.route(lambda url: url.split("?")[0].endswith(f"/sessions/{sid}"), hold_one_waiting_read)
    chat.page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")
    expect(chat.reply("Deleted old_logs.txt")).to_be_visible(timeout=30_000)
    assert held, "the page did not read the waiting session"
    expect(chat.status()).to_have_text("Ready")
    assert chat.page.evaluate("window.mostCopies") == 1


def test_the_record_of_a_decision_stays_in_the_conversation(open_chat, start_server, tmp_path):
    server = start_server(
        "examples.serving.hitl_agent:agent", "--api-key", "alice=s3cret-alice",
        env={"MOTUS_EXAMPLE_OFFLINE": "1", "MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox")},
    )
    chat = open_chat(server).open_with_key("s3cret-alice")
    chat.send("delete the old logs file")
    card = chat.card("Approve this tool call?")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(chat.reply("Deleted old_logs.txt")).to_be_visible()

    audit = server.with_headers({"Authorization": "Bearer s3cret-alice"}).get(f"/sessions/{chat.session_id}/audit").json()
    resolved = [entry for entry in audit if entry["kind"] == "resolved"]
    assert len(resolved) == 1 and resolved[0]["by"] == "alice"
    record = chat.page.locator(".msg.record.approved")
    expect(record).to_have_count(1)
    expect(record).to_contain_text("Approved delete_file by alice at")
    expect(record.locator("time")).to_have_attribute("datetime", datetime.fromisoformat(resolved[0]["at"].replace("Z", "+00:00")).isoformat(timespec="milliseconds").replace("+00:00", "Z"))
    # Every message shows its time.
    expect(chat.page.locator(".msg.user .who time")).to_have_count(1)
    expect(chat.page.locator(".msg.assistant .who time").first).to_be_visible()
    # The record comes after the request and before the final reply.
    assert record.bounding_box()["y"] < chat.reply("Deleted old_logs.txt").bounding_box()["y"]

    # A fresh tab reads the record from the audit.
    chat.page.reload()
    expect(chat.page.locator(".msg.record.approved")).to_contain_text("Approved delete_file by alice")
    chat.shot("record")


def test_two_concurrent_approvals_show_at_once_numbered(open_chat, example_server):
    chat = open_chat(example_server)
    chat.page.add_init_script(
        """new MutationObserver(() => {
             window.cardSeen = window.cardSeen || {};
             for (const card of document.querySelectorAll('#interrupts article.card')) {
               const id = card.dataset.interruptId;
               if (!(id in window.cardSeen)) window.cardSeen[id] = Date.now();
             }
           }).observe(document, {subtree: true, childList: true});"""
    )
    chat.open()
    chat.send("delete and move both")
    expect(chat.cards()).to_have_count(2)
    session = example_server.get(f"/sessions/{chat.session_id}").json()
    # Numbered in the order the server lists them (the order they were raised), whatever
    # order their events and reads reached the page in.
    first, second = (item["payload"]["tool_name"] for item in session["interrupts"])
    expect(chat.card(first).locator(".card-count")).to_have_text("1 of 2")
    expect(chat.card(second).locator(".card-count")).to_have_text("2 of 2")
    seen = chat.page.evaluate("() => window.cardSeen")
    steps = [step for step in session["turn"]["steps"] if step["kind"] == "interrupt"]
    assert len(steps) == 2
    for step in steps:
        lag = seen[step["interrupt_id"]] - _ms(step["created_at"])
        assert lag < 1000, (step["payload"]["tool_name"], lag)
    chat.shot("two-cards")


def test_markdown_renders_and_html_stays_inert(open_chat, start_server):
    server = start_server("tests.agents.markdown:agent")
    chat = open_chat(server).open()
    chat.send("show me")
    reply = chat.page.locator(".msg.assistant .text.md")
    expect(reply).to_be_visible()
    expect(reply.locator("p strong")).to_have_text("the plan")
    expect(reply.locator("em")).to_have_text("today")
    expect(reply.locator("p code").first).to_have_text("rm -i")
    expect(reply.locator("ol > li")).to_have_count(2)
    expect(reply.locator("ul > li")).to_have_count(2)
    expect(reply.locator("pre.md-code code")).to_have_text('print("<b>hi</b>")')
    expect(reply.locator("a")).to_have_count(1)
    expect(reply.locator("a")).to_have_attribute("href", "https://example.com/guide")
    # A table is a table (issue 28, item 8: it showed as raw pipes), its cells inline Markdown.
    table = reply.locator("table")
    expect(table.locator("thead th")).to_have_text(["file", "size", "action"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(["old_logs.txt", "12 KB", "delete"])
    expect(table.locator("tbody tr").first.locator("td strong")).to_have_text("delete")
    expect(table.locator("tbody tr").nth(1).locator("td").first).to_have_text("a|b.txt")
    expect(table.locator("tbody td").nth(1)).to_have_css("text-align", "right")
    expect(reply).not_to_contain_text("|---")
    expect(reply).to_contain_text("snake_case_name")
    expect(reply).to_contain_text('<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">')
    expect(chat.page.locator("#messages").locator("script, img, b, i, [onerror]")).to_have_count(0)
    assert chat.page.evaluate("() => window.pwned") is None
    chat.shot("markdown")


def test_the_inbox_groups_items_by_session_with_what_each_turn_asked(open_chat, keyed_example_server):
    """A second person decides from the Inbox alone: each session's items sit under its
    title, the message that started the turn, who sent it and when; they are numbered
    within their session ("1 of 2" twice, not "1 of 4"). The sidebar shows titles."""
    server = keyed_example_server
    alice = server.with_headers({"Authorization": "Bearer s3cret-alice"})
    first = alice.post("/sessions", json={}).json()["session_id"]
    alice.post(f"/sessions/{first}/messages", json={"content": "delete and move both"}).raise_for_status()
    second = alice.post("/sessions", json={"title": "Archive the notes"}).json()["session_id"]
    alice.post(f"/sessions/{second}/messages", json={"content": "delete notes.txt and move old_logs.txt"}).raise_for_status()
    wait_until(lambda: len(alice.get("/interrupts").json()) == 4, what="four pending approvals")

    chat = open_chat(server).open_with_key("s3cret-bob", "/inbox")
    inbox = chat.page.locator("#inbox-list")
    expect(inbox.locator("article.card")).to_have_count(4)
    expect(inbox.locator(".inbox-session")).to_have_count(2)
    # (in the order of their oldest items: the two turns run at once, either may ask first)
    one, two = (inbox.locator(f'.inbox-session[data-session-id="{sid}"]') for sid in (first, second))
    expect(one.locator(".inbox-session-title")).to_have_text("delete and move both")
    expect(one.locator(".inbox-message")).to_contain_text("alice asked at")
    expect(one.locator(".inbox-message .inbox-text")).to_have_text("delete and move both")
    expect(two.locator(".inbox-session-title")).to_have_text("Archive the notes")
    expect(two.locator(".inbox-message .inbox-text")).to_have_text("delete notes.txt and move old_logs.txt")
    for group in (one, two):
        expect(group.locator(".card-count")).to_have_text(["1 of 2", "2 of 2"])
    chat.shot("inbox-context")

    # Answering one leaves its session's other item alone and unnumbered.
    one.locator("article.card").first.get_by_role("button", name="Approve", exact=True).click()
    expect(one.locator("article.card")).to_have_count(1)
    expect(one.locator(".card-count")).to_be_hidden()
    expect(two.locator(".card-count")).to_have_text(["1 of 2", "2 of 2"])

    # The sidebar names sessions by their titles.
    sidebar = chat.page.get_by_role("navigation", name="Sessions").locator("#session-list")
    expect(sidebar.locator(f'a[data-sid="{first}"] .session-title')).to_have_text("delete and move both")
    expect(sidebar.locator(f'a[data-sid="{second}"] .session-title')).to_have_text("Archive the notes")


def test_the_inbox_answers_across_sessions(open_chat, start_server, tmp_path):
    server = start_server(CALLS_AGENT, env={"MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox"), "MOTUS_TEST_APPROVAL_TIMEOUT": "600"})
    first, second, third = (server.create_session() for _ in range(3))
    server.post(f"/sessions/{first}/messages", json={"content": "delete_file a; delete_file a2"}).raise_for_status()
    server.post(f"/sessions/{second}/messages", json={"content": "delete_file b"}).raise_for_status()
    wait_until(lambda: len(server.get("/interrupts?status=pending").json()) == 2, what="two pending approvals")

    chat, inbox = open_inbox(open_chat, server, 2)
    # Live: an approval that appears later shows without a reload, with its countdown.
    server.post(f"/sessions/{third}/messages", json={"content": "send_money 5"}).raise_for_status()
    expect(inbox.locator("article.card")).to_have_count(3)
    money = inbox.locator(".inbox-item", has=chat.page.locator("code", has_text="send_money"))
    expect(money.locator(".countdown")).to_have_text(__import__("re").compile(r"Expires in (9|10):\d\d"))

    a = inbox.locator(f'.inbox-item[data-session-id="{first}"]')
    a.get_by_label("Remember for this session").check()
    a.get_by_role("button", name="Approve", exact=True).click()
    b = inbox.locator(f'.inbox-item[data-session-id="{second}"]')
    b.get_by_label("Reason if you reject (optional)").fill("not b")
    b.get_by_role("button", name="Reject").click()
    money.get_by_role("button", name="Approve", exact=True).click()
    expect(inbox.locator("article.card")).to_have_count(0)
    for sid in (first, second, third):
        wait_until(lambda sid=sid: server.get(f"/sessions/{sid}").json()["status"] == "idle", what=f"{sid} to end")
    # The remembered grant let a2 through without asking.
    assert (tmp_path / "sandbox" / "ran-delete_file").read_text().split() == ["a", "a2"]
    assert [g["tool_name"] for g in server.get(f"/sessions/{first}/grants").json()] == ["delete_file"]
    assert [post["value"] for post in chat.resume_posts()] == [
        {"approved": True, "remember": "session"}, {"approved": False, "reason": "not b"}, {"approved": True},
    ]

    # The session's audit view lists who decided what.
    chat.page.goto(server.url + f"/ui/#/sessions/{second}")
    chat.page.get_by_role("button", name="Audit").click()
    audit = chat.page.locator("#audit-list")
    expect(audit.locator("li")).to_have_count(1)
    expect(audit).to_contain_text("anonymous: Rejected delete_file")
    expect(chat.page.locator(".msg.record.rejected")).to_contain_text("Reason: not b")
    chat.shot("audit")


def test_the_inbox_view_reads_the_inbox_again_only_for_changes_that_concern_it(open_chat, start_server, tmp_path):
    """With thousands pending each read is the whole inbox, and the view read it again at
    every status it heard of (6-9 reads here): other sessions' turns that ask nothing
    (running, then idle) are no reason to; an interrupt that comes, and the deletion of a
    session it shows, still are."""
    server = start_server(CALLS_AGENT, env={"MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox"), "MOTUS_TEST_APPROVAL_TIMEOUT": "600"})
    waiting, busy, later = (server.create_session() for _ in range(3))
    server.post(f"/sessions/{waiting}/messages", json={"content": "delete_file a"}).raise_for_status()
    wait_until(lambda: len(server.get("/interrupts?status=pending").json()) == 1, what="one pending approval")
    chat, inbox = open_inbox(open_chat, server, 1)

    def reads() -> int:
        return sum(1 for r in chat.requests if r.method == "GET" and "/interrupts" in r.url)

    wait_streaming(chat)  # its opening wakes one more read: counted from here
    before = reads()
    for _ in range(5):  # turns that ask nothing, on another session
        server.post(f"/sessions/{busy}/messages", json={"content": ";"}).raise_for_status()
        server.wait_for_status(busy, "idle")
    # A change that concerns the inbox, after them in the stream: once it shows, the view
    # has seen every event before it.
    server.post(f"/sessions/{later}/messages", json={"content": "delete_file b"}).raise_for_status()
    expect(inbox.locator("article.card")).to_have_count(2)
    assert reads() - before <= 3, f"{reads() - before} reads of the inbox for 5 turns that asked nothing and one interrupt"

    assert server.delete(f"/sessions/{later}").status_code == 204
    expect(inbox.locator("article.card")).to_have_count(1)
    expect(inbox.locator(f'.inbox-item[data-session-id="{later}"]')).to_have_count(0)


def test_the_inbox_view_shows_the_oldest_200_and_says_how_many_wait(open_chat, start_server):
    """With thousands pending, the view reads and shows the oldest 200 (``?limit``), and says
    how many wait in all (``X-Total-Count``)."""
    server = start_server("tests.agents.gather_attack:many_large", "--workers", "4")
    sessions = [server.create_session() for _ in range(4)]
    for sid in sessions:
        server.post(f"/sessions/{sid}/messages", json={"content": "60 10"}).raise_for_status()
    wait_until(lambda: server.get("/interrupts?limit=1").headers["X-Total-Count"] == "240", what="240 pending approvals")
    chat, inbox = open_inbox(open_chat, server, 200)
    expect(chat.page.locator("#inbox-state")).to_have_text("240 waiting for an answer; the oldest 200 are shown.")
    oldest = [i["interrupt_id"] for i in server.get("/interrupts?limit=200").json()]
    shown = inbox.locator("article.card").evaluate_all("cards => cards.map(card => card.dataset.interruptId)")
    assert shown == oldest
    assert all("limit=200" in r.url for r in chat.requests if r.method == "GET" and "/interrupts" in r.url)


def test_another_persons_message_is_labelled_with_their_name_and_the_time_they_sent_it(open_chat, keyed_example_server):
    server = keyed_example_server
    alice = server.with_headers({"Authorization": "Bearer s3cret-alice"})
    session_id = alice.post("/sessions", json={}).json()["session_id"]
    alice.post(f"/sessions/{session_id}/messages", json={"content": "delete the old logs file"}).raise_for_status()
    wait_until(lambda: alice.get(f"/sessions/{session_id}").json()["status"] == "interrupted", what="the approval")
    sent_at = alice.get(f"/sessions/{session_id}").json()["turn"]["started_at"]

    chat = open_chat(server).open_with_key("s3cret-bob")
    chat.page.goto(server.url + f"/ui/#/sessions/{session_id}")
    asked = chat.page.locator(".msg.user", has_text="delete the old logs file")
    expect(asked.locator(".who")).to_contain_text("alice")
    expect(asked.locator(".who time")).to_have_attribute("datetime", sent_at)
    chat.card("Approve this tool call?").get_by_role("button", name="Approve", exact=True).click()
    expect(chat.reply("Deleted old_logs.txt")).to_be_visible()
    # Stored now: still alice's, at the time she sent it (not when the turn ended).
    expect(asked.locator(".who")).to_contain_text("alice")
    expect(asked.locator(".who time")).to_have_attribute("datetime", sent_at)
    chat.page.reload()
    expect(chat.page.locator(".msg.user", has_text="delete the old logs file").locator(".who time")).to_have_attribute("datetime", sent_at)
    # bob's own message is his.
    chat.send("list the files")
    mine = chat.page.locator(".msg.user", has_text="list the files")
    expect(chat.page.locator(".msg.assistant").last).to_contain_text("invoice_2024.pdf")  # the listing: the turn ended
    expect(mine).to_have_count(1)
    expect(mine.locator(".who")).to_contain_text("bob")


def test_a_two_person_approval_shows_its_quorum_and_offers_each_key_only_what_it_may_do(open_chat, start_server, tmp_path):
    """``release_funds`` needs two keys with the role finance. bob's card says so and has no
    "Edit arguments" (every approver approves the same call); once bob approves, the card
    stays with "1 of 2 approvals: bob" and no Approve button for him. dave (role ops) sees
    the card without buttons and why. carol's approval, sent elsewhere, ends it in both tabs."""
    server = start_server(
        CALLS_AGENT, "--api-key", "alice=s3cret-alice", "--api-key", "bob=s3cret-bob:finance",
        "--api-key", "carol=s3cret-carol:finance", "--api-key", "dave=s3cret-dave:ops",
        env={"MOTUS_EXAMPLE_DIR": str(tmp_path / "sandbox")},
    )
    alice = server.with_headers({"Authorization": "Bearer s3cret-alice"})
    sid = alice.post("/sessions", json={}).json()["session_id"]
    alice.post(f"/sessions/{sid}/messages", json={"content": "release_funds 7"}).raise_for_status()
    [item] = alice.wait_for_status(sid, "interrupted")["interrupts"]

    bob = open_chat(server).open_with_key("s3cret-bob", f"/sessions/{sid}")
    card = bob.card("Approve this tool call?")
    expect(card.locator(".card-policy")).to_have_text("Who may approve: 2 different keys with the role finance")
    expect(card.locator(".card-progress")).to_have_text("0 of 2 approvals")
    expect(card.get_by_role("button", name="Edit arguments")).to_have_count(0)
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.locator(".card-progress")).to_have_text("1 of 2 approvals: bob")
    expect(card.locator(".card-cannot")).to_have_text("You approved this; it needs 1 more from another key. You may still reject it.")
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
    expect(card.get_by_role("button", name="Reject")).to_be_visible()
    bob.shot("quorum-one-of-two")
    assert [post["value"] for post in bob.resume_posts()] == [{"approved": True}]

    dave = open_chat(server).open_with_key("s3cret-dave", f"/sessions/{sid}")
    other = dave.card("Approve this tool call?")
    expect(other.locator(".card-progress")).to_have_text("1 of 2 approvals: bob")
    expect(other.locator(".card-cannot")).to_have_text("Your key (dave) cannot answer this: it needs the role finance.")
    expect(other.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
    expect(other.get_by_role("button", name="Reject")).to_be_hidden()
    dave.shot("quorum-no-role")

    carol = server.with_headers({"Authorization": "Bearer s3cret-carol"})
    answer = carol.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"approved": True}})
    assert answer.status_code == 200, answer.text
    for chat in (bob, dave):
        expect(chat.reply("released 7")).to_be_visible()
        expect(chat.cards()).to_have_count(0)


def test_the_inbox_view_shows_what_the_agent_said_while_its_question_waits(open_chat, start_server, tmp_path):
    """A model reply finished while the question waits changes the item's ``agent_text``
    (``GET /interrupts`` shows it at once); the view shows it too, not a minute later at its
    refresh: no event of the stream says so, and the view reads again only for events."""
    sandbox = tmp_path / "sandbox"
    server = start_server("tests.agents.approval:asks_while_thinking", env={"MOTUS_EXAMPLE_DIR": str(sandbox)})
    sid = server.create_session()
    server.post(f"/sessions/{sid}/messages", json={"content": "think"}).raise_for_status()
    wait_until(lambda: len(server.get("/interrupts").json()) == 1, what="the question pending")
    chat, inbox = open_inbox(open_chat, server, 1)
    expect(inbox.locator(".inbox-agent")).to_have_count(0)
    wait_streaming(chat)
    (sandbox / "release-thinking").touch()
    wait_until(lambda: server.get("/interrupts").json()[0]["context"]["agent_text"] == "Meanwhile I looked it up.",
               what="the reply in the inbox")
    expect(inbox.locator(".inbox-agent")).to_contain_text("Meanwhile I looked it up.")


def test_the_inbox_views_count_follows_a_session_beyond_the_oldest_200(open_chat, start_server):
    """With 210 pending the view shows the oldest 200 and says 210 wait. The session of the
    other 10 (none shown) is deleted: 200 wait now. Its "status: deleted" event is of a
    session the view does not show (``concernsInbox`` lets it by), so the count said stays
    "210" until the view's one-minute refresh."""
    server = start_server("tests.agents.gather_attack:many_large", "--workers", "5")
    sessions = [server.create_session() for _ in range(5)]
    for n, sid in enumerate(sessions):  # one after the other: the last session's items are the newest
        server.post(f"/sessions/{sid}/messages", json={"content": "10 10" if n == 4 else "50 10"}).raise_for_status()
        wait_until(lambda n=n: server.get("/interrupts?limit=1").headers["X-Total-Count"] == str(50 * n + (10 if n == 4 else 50)),
                   what="the session's approvals pending")
    chat, inbox = open_inbox(open_chat, server, 200)
    expect(chat.page.locator("#inbox-state")).to_have_text("210 waiting for an answer; the oldest 200 are shown.")
    expect(inbox.locator(f'.inbox-item[data-session-id="{sessions[4]}"]')).to_have_count(0)
    wait_streaming(chat)
    assert server.delete(f"/sessions/{sessions[4]}").status_code == 204
    assert server.get("/interrupts?limit=1").headers["X-Total-Count"] == "200"
    expect(chat.page.locator("#inbox-state")).to_have_text("200 waiting for an answer.")
