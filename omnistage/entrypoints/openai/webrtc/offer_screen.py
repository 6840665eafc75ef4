"""An SDP offer screened before aiortc reads it: its bounds checked on the text, its ICE candidates judged.

aiortc parses the offer and pairs its candidates on the event loop, in time that grows faster than the offer
(pairing is quadratic in the candidates: 2,000 of them held the loop 0.7 s, 40,000 for minutes), so the bounds of
:class:`~omnistage.entrypoints.openai.server_config.WebRtcPolicy` are checked first, each a 400 naming its flag:
the offer's size, its media sections, its candidates. Then each candidate's address is judged as a media URL's
host is (``common/addresses.py``): the server sends STUN checks to every candidate it keeps, so an offer must not
make it probe its own networks. Public addresses are kept, and those in the allowed networks; the others, and
host names (mDNS ``.local`` names, which aioice would resolve by multicast on the server's network), are left
out of the offer aiortc gets. The peer still connects through its own checks to the server's candidates (as a
browser that sends its offer before gathering does: peer-reflexive candidates), so when any candidate is left
out, ``a=end-of-candidates`` is too, or aioice would give up on an empty list at once.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from omnistage.entrypoints.openai.common.addresses import embedded_ipv4, is_public
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.server_config import WebRtcPolicy

logger = logging.getLogger(__name__)
CANDIDATE = "a=candidate:"
END_OF_CANDIDATES = "a=end-of-candidates"


@dataclass(frozen=True)
class ScreenedOffer:
    sdp: str  # what aiortc gets: the offer less the candidates left out
    left_out: tuple[str, ...] = ()  # the addresses of those candidates (logged)


def _refused(message: str, code: str) -> APIError:
    return APIError(400, message, param="sdp", code=code)


def screen_offer(sdp: str, policy: WebRtcPolicy) -> ScreenedOffer:
    """The offer aiortc may read; a 400 naming the bound it passes, or what it lacks."""
    size = len(sdp.encode("utf-8", "surrogatepass"))
    if size > policy.max_sdp_bytes:
        raise _refused(f"the SDP offer is {size} bytes; the limit is {policy.max_sdp_bytes} (--webrtc-max-sdp-bytes)",
                       "sdp_too_large")
    if not sdp.lstrip().startswith("v=0"):
        raise _refused("the body is not an SDP offer (it must start with 'v=0')", "invalid_offer")
    lines = sdp.splitlines()
    _check_counts(lines, policy)
    kept, left_out = [], []
    for line in lines:
        address = _candidate_address(line) if line.startswith(CANDIDATE) else None
        if address is not None and not _allowed(address, policy):
            left_out.append(address)
        else:
            kept.append(line)
    if left_out:
        kept = [line for line in kept if line.strip() != END_OF_CANDIDATES]
        logger.info("webrtc offer: left out %d ICE candidate(s) at non-public addresses (%s; see "
                    "--webrtc-allowed-networks)", len(left_out), ", ".join(left_out[:8]))
    return ScreenedOffer("\r\n".join(kept) + "\r\n", tuple(left_out))


def _check_counts(lines: list[str], policy: WebRtcPolicy) -> None:
    sections = [line for line in lines if line.startswith("m=")]
    if len(sections) > policy.max_media_sections:
        raise _refused(f"the offer has {len(sections)} media sections; the limit is {policy.max_media_sections} "
                       "(--webrtc-max-media-sections)", "too_many_media_sections")
    if not any(line.startswith("m=audio ") for line in sections):
        raise _refused("the offer has no audio media section", "invalid_offer")
    candidates = sum(line.startswith(CANDIDATE) for line in lines)
    if candidates > policy.max_candidates:
        raise _refused(f"the offer has {candidates} ICE candidates; the limit is {policy.max_candidates} "
                       "(--webrtc-max-candidates)", "too_many_candidates")


def _candidate_address(line: str) -> str:
    """``a=candidate:FOUNDATION COMPONENT TRANSPORT PRIORITY ADDRESS PORT typ TYPE ...``'s address."""
    fields = line[len(CANDIDATE):].split()
    if len(fields) < 8 or fields[6] != "typ":
        raise _refused("an ICE candidate line is malformed (a=candidate:FOUNDATION COMPONENT TRANSPORT PRIORITY "
                       "ADDRESS PORT typ TYPE)", "invalid_candidate")
    return fields[4]


def _allowed(address: str, policy: WebRtcPolicy) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # a host name: an mDNS name stands for an address on the peer's local network
        return False
    if is_public(ip):
        return True
    plain = embedded_ipv4(ip)
    return any(ip in network or plain in network for network in policy.allowed_networks)
