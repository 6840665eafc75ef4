import pytest

from omnistage.families.pocket_tts.make_tiny import make_tiny_pocket


@pytest.fixture(scope="session")
def pocket_lsd(tmp_path_factory):
    return make_tiny_pocket(tmp_path_factory.mktemp("pocket_lsd"))


@pytest.fixture(scope="session")
def pocket_drifting(tmp_path_factory):
    return make_tiny_pocket(tmp_path_factory.mktemp("pocket_drifting"), flow_type="drifting")
