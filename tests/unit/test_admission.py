"""Goal: a node admission's signature covers its exact body and its time (multiraft/node/admission.py)."""

from __future__ import annotations

import pytest

from multiraft.node import admission


def test_a_signature_covers_the_exact_body_and_its_time() -> None:
    secret = b"s" * 32
    body = b'{"node_id": 1}'
    headers = admission.sign(secret, body, 1_000_000)
    admission.verify(secret, body, headers[admission.TIMESTAMP_HEADER], headers[admission.SIGNATURE_HEADER],
                     1_000_100)
    for changed_body, now in ((body + b" ", 1_000_000), (body, 1_000_000 + admission.ADMISSION_SKEW_S + 1)):
        with pytest.raises(admission.NotAuthorized):
            admission.verify(secret, changed_body, headers[admission.TIMESTAMP_HEADER],
                             headers[admission.SIGNATURE_HEADER], now)
