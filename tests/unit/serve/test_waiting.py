"""``motus.serve.waiting``: how tickets are woken, one at a time and many at once."""

from __future__ import annotations

from motus.serve.waiting import Ticket, wake_all


def test_wake_all_hands_each_holders_tickets_over_in_one_call_and_skips_those_not_parked() -> None:
    first_holder: list[list[Ticket]] = []
    second_holder: list[list[Ticket]] = []
    parked = [Ticket(first_holder.append, lambda: True, f"conn-{n}") for n in range(3)]
    other = Ticket(second_holder.append, lambda: True, "elsewhere")
    not_parked = Ticket(first_holder.append, lambda: True, "conn-x")
    for ticket in [*parked, other]:
        ticket.arm()
    wake_all([*parked, other, not_parked])
    assert first_holder == [parked] and [t.subject for t in first_holder[0]] == ["conn-0", "conn-1", "conn-2"]
    assert second_holder == [[other]]
    wake_all([*parked, other])  # woken once per park: a second publish finds them taken
    assert first_holder == [parked] and second_holder == [[other]]


def test_a_single_wake_and_a_disarm_count_once_per_park() -> None:
    woken: list[list[Ticket]] = []
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
    assert woken == [[ticket]]
