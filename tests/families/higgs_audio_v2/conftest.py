import pytest

from omnistage.families.higgs_audio_v2.make_tiny import make_tiny_higgs


@pytest.fixture(scope="session")
def higgs_tiny(tmp_path_factory):
    return make_tiny_higgs(tmp_path_factory.mktemp("higgs_tiny"))
