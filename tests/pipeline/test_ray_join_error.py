"""A cluster the server cannot join is one line naming the address and how to pass Ray's token (no cluster needed:
``ray.init`` is replaced by what Ray 2.60 raises)."""

from __future__ import annotations

import pytest

from omnistage.pipeline import ray_cluster
from omnistage.pipeline.ray_cluster import RayCluster, RayJoinError, join_error_message

ray = pytest.importorskip("ray")


def test_the_message_names_the_address_and_the_token() -> None:
    message = join_error_message("10.0.0.7:6379", ConnectionError("Failed to connect to Ray cluster at 10.0.0.7:6379"))
    assert "\n" not in message
    assert message.startswith("cannot join the Ray cluster at 10.0.0.7:6379 (ConnectionError: Failed to connect")
    for hint in ("token authentication", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=", "~/.ray/auth_token",
                 "ray get-auth-token", "docs/ray.md"):
        assert hint in message
    assert "on this machine ($RAY_ADDRESS)" in join_error_message(None, TimeoutError())


@pytest.mark.parametrize("raised", [
    ConnectionError("Failed to connect to Ray cluster at 10.0.0.7:6379"),  # no token: Ray logs InvalidAuthToken
    ray.exceptions.AuthenticationError("Token authentication is enabled but no authentication token was found"),
])
def test_connect_raises_a_join_error_from_rays(monkeypatch: pytest.MonkeyPatch, raised: Exception) -> None:
    def refuse(address: str | None = None, **_: object) -> None:
        raise raised

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(RayJoinError, match=r"cannot join the Ray cluster at 10\.0\.0\.7:6379 .*RAY_AUTH_MODE=token") \
            as caught:
        RayCluster.connect("10.0.0.7:6379")
    assert isinstance(caught.value, RuntimeError) and caught.value.__cause__ is raised
    assert ray_cluster._OWNED_USERS == 0  # a failed join holds no connection
