"""Fixtures shared by every test folder."""
from __future__ import annotations

import base64
import random
import string
from dataclasses import dataclass

import pytest

# The compiled loops' disk cache (restbase/jit.py) goes into the environment now, before any test gives a daemon
# a cache root of its own: every process of the session then shares one cache and compiles nothing twice.
import restbase.jit  # noqa: E402,F401


@dataclass
class SecretSamples:
    """Real-looking credentials, generated fresh for a test (none of them is valid anywhere)."""
    aws_key_id: str
    aws_secret: str
    github_token: str
    db_password: str
    api_key: str
    pem: str                     # a whole private-key block

    def values(self) -> dict[str, str]:
        """What must never reach a datastore or a draft (the PEM's body lines included)."""
        body = [ln for ln in self.pem.splitlines() if ln and not ln.startswith("-----")]
        return {"aws_key_id": self.aws_key_id, "aws_secret": self.aws_secret, "github": self.github_token,
                "db_password": self.db_password, "api_key": self.api_key, "pem_body": body[3]}

    def config_py(self) -> str:
        return (f'import os\n\nAWS_ACCESS_KEY_ID = "{self.aws_key_id}"\n'
                f'AWS_SECRET_ACCESS_KEY = "{self.aws_secret}"\n'
                f'GITHUB_TOKEN = "{self.github_token}"\n'
                f'DATABASE_URL = "postgres://app:{self.db_password}@db.internal.example:5432/app"\n\n\n'
                'def region():\n    return os.environ.get("AWS_REGION", "eu-west-1")\n')

    def settings_py(self) -> str:
        return f'DEBUG = False\nAPI_KEY = "{self.api_key}"\nTIMEOUT = 30\n'


def make_secrets(seed: str) -> SecretSamples:
    rng = random.Random(seed)

    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    alnum = string.ascii_letters + string.digits
    key_bytes = bytes(rng.randrange(256) for _ in range(900))
    b64 = base64.b64encode(key_bytes).decode()
    pem = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64)) + \
        "\n-----END RSA PRIVATE KEY-----\n"
    return SecretSamples(
        aws_key_id="AKIA" + pick(string.ascii_uppercase + "234567", 16),
        aws_secret=pick(alnum + "/+", 40),
        github_token="ghp_" + pick(alnum, 36),
        db_password=pick(alnum, 18),
        api_key=pick(string.ascii_lowercase + string.digits, 32),
        pem=pem)


@pytest.fixture
def secrets_sample(request) -> SecretSamples:
    return make_secrets(request.node.name)
