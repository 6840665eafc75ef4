"""Which IP addresses a client may make the server send to: public ones only, by default.

One classification for every place a client names an address the server then contacts: a media URL's host
(``media/remote_fetch.py``) and a WebRTC offer's ICE candidates (``webrtc/offer_screen.py``). Loopback, private,
shared, link-local (cloud metadata among them), multicast, reserved and unspecified addresses are not public;
IPv4-mapped and 6to4/NAT64-embedded IPv4 are judged as the IPv4 they carry.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), else the address itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def is_public(ip: IPAddress) -> bool:
    ip = embedded_ipv4(ip)
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local
                                 or ip.is_unspecified or ip.is_private)
