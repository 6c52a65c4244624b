"""``motus.serve.waiting``: how tickets are woken, one at a time and many at once."""

from __future__ import annotations

from motus.serve.waiting import Ticket, wake_all


def test_wake_all_hands_each_holders_tickets_over_in_one_call_and_skips_those_not_parked() -> None:
    singles: list[Ticket] = []
    batches: list[list[Ticket]] = []

    def held_by_worker(subject: str) -> Ticket:
        return Ticket(singles.append, lambda: True, batches.append, subject)

    parked = [held_by_worker(f"conn-{n}") for n in range(3)]
    plain = Ticket(singles.append, lambda: True)  # a holder that takes tickets one at a time
    not_parked = held_by_worker("conn-x")
    for ticket in [*parked, plain]:
        ticket.arm()
    wake_all([*parked, plain, not_parked])
    assert batches == [parked] and [t.subject for t in batches[0]] == ["conn-0", "conn-1", "conn-2"]
    assert singles == [plain]
    wake_all([*parked, plain])  # woken once per park: a second publish finds them taken
    assert batches == [parked] and singles == [plain]


def test_a_single_wake_and_a_disarm_count_once_per_park() -> None:
    woken: list[Ticket] = []
    ticket = Ticket(woken.append, lambda: True)
    ticket.wake()
    assert woken == []  # not parked: nothing to wake
    ticket.arm()
    assert ticket.disarm() is True and ticket.disarm() is False
    ticket.wake()
    assert woken == []
    ticket.arm()
    ticket.wake()
    ticket.wake()
    assert woken == [ticket]
