import pytest

from omnistage.families.moshi.make_tiny import make_tiny_moshi


@pytest.fixture(scope="session")
def moshi_tiny(tmp_path_factory):
    return make_tiny_moshi(tmp_path_factory.mktemp("moshi_tiny"))


@pytest.fixture(scope="session")
def personaplex_tiny(tmp_path_factory):
    return make_tiny_moshi(tmp_path_factory.mktemp("personaplex_tiny"), layout="personaplex")
