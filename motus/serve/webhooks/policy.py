"""Which resolved addresses a webhook delivery may reach: the address policy.

``refusal`` judges one address the webhook's host resolved to (the transport asks it about
every one of them before it connects to any, see ``transport``). Always refused: link-local
(169.254.0.0/16, fe80::/10; this covers most cloud metadata endpoints), the remaining cloud
metadata addresses (fd00:ec2::254, 100.100.100.200), 0.0.0.0/8, the unspecified address,
multicast, broadcast, 240.0.0.0/4 and the deprecated IPv4-compatible IPv6 addresses. When the
server is bound to a non-loopback address (``exposed``), also loopback (127.0.0.0/8, ::1) and
private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 and the other non-global
ranges), unless ``Allow`` (the ``--webhook-allow CIDR|HOST`` server option) covers the address
or names the host (case-insensitively). IPv4 addresses embedded in IPv6 ones (IPv4-mapped,
NAT64, 6to4) are judged as the IPv4 address.

Pure functions of their arguments: no I/O, no state, no logging.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from motus.api.webhook_urls import IPAddress, check_host


def _nets(*cidrs: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c) for c in cidrs]


#: Refused wherever the server is bound, whatever ``allow`` says.
ALWAYS_REFUSED: list[tuple[list[Any], str]] = [
    (_nets("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (_nets("fd00:ec2::254/128", "100.100.100.200/32"), "a cloud metadata address"),
    (_nets("0.0.0.0/8"), "a 'this network' address (0.0.0.0/8)"),
    (_nets("::/128"), "the unspecified address"),
    (_nets("224.0.0.0/4", "ff00::/8"), "a multicast address"),
    (_nets("255.255.255.255/32"), "the broadcast address"),
    (_nets("240.0.0.0/4"), "a reserved address"),
]
#: Refused too when the server is bound to a non-loopback address, unless allowed.
EXPOSED_REFUSED: list[tuple[list[Any], str]] = [
    (_nets("127.0.0.0/8", "::1/128"), "a loopback address"),
    (_nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10"), "a private address"),
    (_nets("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV6_LOOPBACK = ipaddress.ip_address("::1")


@dataclass(frozen=True)
class Allow:
    """What ``--webhook-allow`` lets through: networks, and host names (lower case)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allow:
        """``CIDR`` or address or host name each; ``ValueError`` naming a bad one."""
        networks, hosts = [], set()
        for entry in entries:
            text = str(entry).strip()
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if "/" in text or ":" in text:
                raise ValueError(f"--webhook-allow {text!r} is neither a CIDR, an address nor a host name")
            try:
                name, _ = check_host(text)
            except ValueError as exc:
                raise ValueError(f"--webhook-allow {text!r}: {exc}") from None
            hosts.add(name.rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def permits(self, host: str, address: IPAddress) -> bool:
        if host.rstrip(".").lower() in self.hosts:
            return True
        return any(address.version == net.version and address in net for net in self.networks)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def refusal(address: IPAddress, *, exposed: bool = False, allow: Allow | None = None, host: str = "") -> str | None:
    """Why a webhook may not be sent to ``address`` (reached through ``host``), or None."""
    allow = allow or Allow()
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        why = refusal(embedded, exposed=exposed, allow=allow, host=host)
        return None if why is None else f"{why} (as {embedded}, embedded in {address})"
    for networks, what in ALWAYS_REFUSED:
        if any(address.version == net.version and address in net for net in networks):
            return f"{what}, refused always"
    if address.version == 6 and address in _IPV4_COMPATIBLE and address != _IPV6_LOOPBACK:
        return "an IPv4-compatible IPv6 address (deprecated), refused always"
    if not exposed or allow.permits(host, address):
        return None
    for networks, what in EXPOSED_REFUSED:
        if any(address.version == net.version and address in net for net in networks):
            return f"{what}, refused because the server is bound to a non-loopback address (allow it with --webhook-allow)"
    if not address.is_global:
        return "a non-global address, refused because the server is bound to a non-loopback address (allow it with --webhook-allow)"
    return None
