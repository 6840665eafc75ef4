import pytest

from omnistage.families.csm.make_tiny import make_tiny_csm


@pytest.fixture(scope="session")
def csm_tiny(tmp_path_factory):
    return make_tiny_csm(tmp_path_factory.mktemp("csm"))
