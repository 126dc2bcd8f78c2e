"""The workload records an operation's outcome as the server's contract says:
an error that promises nothing happened is `fail`, anything ambiguous is `info`
(the checker then accepts either). Getting this wrong would hide lost writes
(info where fail was meant is merely lenient; fail where info was meant turns a
write that did happen into a false G1a) so each class is pinned here."""

import multiraft.http.errors  # noqa: F401  (registers the HTTP-only codes in the table)
from chaos.workload import DEFINITE, outcome_of
from multiraft.client.http import OutcomeUnknownError, RaftlogError, UnavailableError
from multiraft.errors import error_table


def test_definite_refusals_fail_and_ambiguity_is_info() -> None:
    assert outcome_of(RaftlogError("NOT_LEADER", "refused before proposing", 421, True)) == "fail"
    assert outcome_of(RaftlogError("NOT_ENOUGH_REPLICAS", "", 503, True)) == "fail"
    assert outcome_of(UnavailableError("UNAVAILABLE", "no server took it", 0, True)) == "fail"
    for code in ("OUTCOME_UNKNOWN", "TIMEOUT", "INTERNAL"):
        assert outcome_of(RaftlogError(code, "", 504)) == "info", code
    assert outcome_of(OutcomeUnknownError("OUTCOME_UNKNOWN", "answer lost", 0)) == "info"
    assert outcome_of(TimeoutError()) == "info"


def test_every_definite_code_exists_and_no_ambiguous_code_is_definite() -> None:
    table = error_table()
    assert DEFINITE - {"UNAVAILABLE"} <= set(table), "codes the server really has"
    assert not DEFINITE & {"OUTCOME_UNKNOWN", "TIMEOUT", "INTERNAL", "REQUEST_TIMEOUT"}
