"""Fixtures shared by the level-2/3 tests."""

import pytest


@pytest.fixture
def aws_env(monkeypatch):
    """Test credentials and region for an in-process S3 (moto), and no endpoint from the environment."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
