"""Goal: a fuzz pass of the whole API from its own OpenAPI document (schemathesis)
answers no 5xx, every error answer has the one shape `{"error_code", "message"}`,
and every answer matches the document (status code, content type, body schema).

The document is fetched from the live `/v1/openapi.json` of the package's 3-node
cluster (tests/http/conftest.py) and every operation in it is fuzzed, with data
that fits the document (positive) and data that does not (negative), each
request going to one of the three nodes in turn. Operations on `{topic}` run
twice: with generated names (almost always unknown topics) and with the name of
a real topic, so the handlers behind the topic lookup see the bad input too. An
operation with several request media types gets bodies of each (schemathesis
picks one per case); binary batches (`application/vnd.raftlog.batch`) are valid
encoded batches, corrupted ones (a flipped byte), truncated ones and random bytes. Every distinct failure
is collected (not shrunk) and reported at the end with its request and answer.

Besides the hypothesis cases, schemathesis' coverage phase runs for every operation
(boundary values, each missing parameter or required property, wrong types, wrong
media types, and every method the document does not list for a path). Every answer
is judged by the conformance checks and by `negative_data_rejection` (an invalid
request is refused), `positive_data_acceptance` (a valid one is not refused as
malformed), `missing_required_header` and `unsupported_method` (405 with `Allow`);
the last two judge only coverage cases, which is why that phase runs. The document
has no required header parameter, so `missing_required_header` finds nothing to
judge today; it stays on for when one is added.

Node admissions (`POST /v1/admin/nodes`) are fuzzed as they come, invented
nodes and addresses included: an admission must be signed with the cluster
secret (multiraft/node/admission.py), so every one is refused, and the test checks
afterwards that the catalog's nodes are exactly those it had before.

Nothing is left out silently; these are the deliberate limits:
- Generated cases are bounded where they would be costly or harmful to the
  shared cluster, only within what the document allows (the server is never
  spared a case it must refuse):
  - `partitions` of a topic creation above 3 is lowered to 1..3 (10,000 Raft
    groups on this box would take minutes; the upper range is tested in
    test_api_errors / test_api_topics); every created topic is deleted again;
    likewise `count` of a partition increase above 8 is lowered to 1..8 (the
    real topic grows to 8 partitions at most; test_api_live_ops has the rest);
  - a drain (`POST /v1/admin/nodes/{node}/drain`) is fuzzed as it comes, the
    cluster's own node ids included; every node is undrained after the operation,
    so the shared cluster's later tests find every node leading again;
  - a decommission (`POST /v1/admin/nodes/{node}/decommission`) is fuzzed as it
    comes too: the fuzz topic (RF 3, on all three nodes) leaves a member's replicas
    nowhere to go, so the server refuses it (409 CLUSTER_TOO_SMALL), as it must; every node is
    recommissioned after the operation all the same. The accepted path is
    tests/node/test_decommission.py's (four nodes);
  - the cluster config (`PATCH /v1/admin/config`, the move throttle) is fuzzed as it
    comes; after the operation it is set back to each node's own;
  - `wait_ms` of a consume above 50 is lowered to 0..50: at the log end a
    consume long-polls for `wait_ms` (up to 30 s); the long-poll itself is tested
    in test_api_records; so is `timeout` of a Confluent v2 records GET (its
    long-poll is tested in test_confluent_v2), whose real instance has a request
    timeout of 0 so a GET without `timeout` does not wait either;
- The real-topic variant has no DELETE (it would remove the topic under test);
  DELETE runs with generated names. Likewise the Confluent dialect's instance routes
  run twice, the second time on a real instance (FUZZ_INSTANCE, subscribed to the fuzz
  topic), whose own DELETE is left to generated names.
- An operation whose every input is fixed or absent (GET /v1/topics/{real
  topic}) has no negative cases; it runs positive only.
- `GET /v1/health?ready=cluster` may answer its documented 503 (CLUSTER_NOT_READY)
  should a node of the shared cluster miss its heartbeats on a busy box (the test
  cluster counts a node dead after 2 s); every other 5xx is a finding.
- What a valid request may get besides schemathesis' accepting statuses: 416 (an
  offset beyond the log) and 421 (`forward=false` on a follower), both decided by
  the cluster's state, 400 INVALID_REPLICATION_FACTOR (a factor within the
  document's range but above this cluster's 3 live nodes) and, on a partition
  increase only, 400 INVALID_PARTITIONS for a count not above the topic's current one. An invalid request may
  get 413 (too large is refused before it is parsed).
- A mirror link's `source_ca` (POST /v1/admin/mirrors) must be a PEM bundle of CA
  certificates OpenSSL loads, and only with `source_tls`: no schema can describe a
  certificate, so a valid request may get a 400 INVALID_REQUEST whose message names
  `source_ca` (its refusals are tested in tests/http/test_api_mirror_tls.py).
- A mirror link's `record_filter` texts are bounded in UTF-8 bytes (256), the document's
  `maxLength` in characters: a valid request may get a 400 INVALID_REQUEST naming UTF-8.
- Positive bodies are sent with integral floats as integers (4.0 as 4): JSON Schema
  counts 4.0 an integer, the API refuses it where it wants an integer (as Go's
  encoding/json does), and no document can tell the two apart. Their record
  timestamps are moved within 2^31 ms before now: a batch stores them as 32-bit
  deltas, and the document cannot say that one field bounds another.
- schemathesis leaves out the operation that served the document unless asked;
  the document is loaded as a dict so GET /v1/openapi.json is fuzzed as well.

The fuzz runs in a child process (`python -m tests.http.test_fuzz`): hypothesis
generation is CPU-bound and would fight the cluster's event loop for the GIL in
a thread. Every request has a timeout, the pass stops drawing cases at
FUZZ_BUDGET_S, and the child is killed if it outlives that by a margin.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from multiraft.http.confluent_errors import is_confluent_path
from multiraft.http.limits import BATCH_CONTENT_TYPE
from tests.fuzzing import fuzz_examples
from tests.http.conftest import Cluster
from tests.node.test_node_cluster import until

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]

MAX_EXAMPLES = fuzz_examples(25)  # per operation; `make fuzz` multiplies it
SEED = 20_240_501  # hypothesis draws from this seed (derandomize=True plus an explicit seed)
FUZZ_BUDGET_S = 120.0 * fuzz_examples(1)  # ~30 s alone at scale 1; a busy 2-core CI box needs the room
REQUEST_TIMEOUT_S = 20.0
FUZZ_TOPIC = "fuzz-topic"
FUZZ_TOPIC_PARTITIONS = 2
FUZZ_GROUP, FUZZ_INSTANCE = "fuzz-group", "fuzz-instance"
CREATED_PARTITIONS_MAX = 3
GROWN_PARTITIONS_MAX = 8  # a grown topic's count (POST /v1/topics/{topic}/partitions) is lowered to 1..8
WAIT_MS_FUZZ_MAX = 50
# Documented 5xx answers a fuzzer may meet on a healthy cluster.
DOCUMENTED_5XX: dict[tuple[str, str], int] = {("GET", "/v1/health"): 503}
REPO = Path(__file__).resolve().parents[2]
# Answers to a request the document calls valid that are not the server refusing it as
# malformed: schemathesis' defaults (2xx, 3xx, 401, 403, 404, 409, 429, 5xx) and
# what only the cluster's state decides, which no schema can say.
POSITIVE_STATUSES = ["2xx", "3xx", "401", "403", "404", "409", "416", "421", "429", "5xx"]
# 400s that only the cluster's state decides, as (error_code, operation, message fragment); None
# and "" match any: a replication factor within the document's range (REPLICATION_FACTOR_MAX) but
# above the live nodes of this 3-node cluster; a partition count within the document's range but
# not above the topic's current count (INVALID_PARTITIONS otherwise also means a malformed count,
# which stays a finding); a feature level within the document's range but below the one the
# cluster is finalized at (a new cluster's: 2, so a finalize of 1 is a lowering). Besides, one that the content decides and no schema can describe: a
# mirror link's CA bundle that is not PEM certificates OpenSSL loads (module docstring).
STATE_DEPENDENT_400: tuple[tuple[str, str | None, str], ...] = (
    ("INVALID_REPLICATION_FACTOR", None, ""),
    ("INVALID_PARTITIONS", "POST /v1/topics/{topic}/partitions", "partitions can only be added"),
    ("INVALID_REQUEST", "POST /v1/admin/features", "a level is only ever raised"),
    ("INVALID_REQUEST", "POST /v1/admin/mirrors", "source_ca: "),  # its content refusals only
    # A record filter's texts are bounded in UTF-8 bytes, the document's maxLength in characters.
    ("INVALID_REQUEST", "POST /v1/admin/mirrors", "UTF-8 "),
)
# schemathesis' defaults, and 413: a body beyond its bound is refused before it is parsed, so an
# invalid body that is also too large gets 413 rather than 400.
NEGATIVE_STATUSES = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


@dataclass
class Findings:
    deadline: float
    failures: dict[str, str] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    created_topics: set[str] = field(default_factory=set)

    def add(self, key: tuple[str, ...], report: str) -> None:
        self.failures.setdefault(" | ".join(key), report)

    def stat(self, variant: str) -> dict[str, Any]:
        return self.stats.setdefault(variant, {"cases": 0, "seconds": 0.0, "statuses": {}, "sent": {}})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded(case: Any) -> Any:
    """Bound the costly cases (see the module docstring)."""
    label = f"{case.method.upper()} {case.path}"
    if case.meta is not None and case.meta.generation.mode.is_positive and isinstance(case.body, dict | list):
        case.body = _one_window(_integers(case.body))  # first: 9999.0 becomes 9999, bounded below
    body = case.body
    if label == "POST /v1/topics" and isinstance(body, dict) and _is_int(body.get("partitions")) \
            and body["partitions"] > CREATED_PARTITIONS_MAX:
        case.body = {**body, "partitions": 1 + body["partitions"] % CREATED_PARTITIONS_MAX}
    if label == "POST /v1/topics/{topic}/partitions" and isinstance(body, dict) and _is_int(body.get("count")) \
            and body["count"] > GROWN_PARTITIONS_MAX:  # the real topic grows at most to this
        case.body = {**body, "count": 1 + body["count"] % GROWN_PARTITIONS_MAX}
    query = case.query
    for name in ("wait_ms", "timeout"):  # `timeout`: a Confluent v2 records GET's long-poll
        if isinstance(query, dict) and _is_int(query.get(name)) and query[name] > WAIT_MS_FUZZ_MAX:
            case.query = query = {**query, name: query[name] % (WAIT_MS_FUZZ_MAX + 1)}
    return case


def _batch_bodies() -> Any:
    """Bodies for the binary batch media type: valid, corrupted, truncated batches and noise."""
    from hypothesis import strategies as st

    from storage.batch import Record, encode_batch

    headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=2).map(tuple)
    record = st.builds(lambda key, value, hs: Record(key, value, hs),
                       st.none() | st.binary(max_size=16), st.none() | st.binary(max_size=64), headers)
    valid = st.builds(lambda records, ts: encode_batch(records, first_timestamp_ms=ts),
                      st.lists(record, min_size=1, max_size=5), st.integers(0, 2**41))

    def flip(data: bytes, at: int, mask: int) -> bytes:
        at %= len(data)
        return data[:at] + bytes([data[at] ^ mask]) + data[at + 1:]

    corrupted = st.builds(flip, valid, st.integers(0, 2**16), st.integers(1, 255))
    truncated = st.builds(lambda data, at: data[:at % len(data)], valid, st.integers(0, 2**16))
    return st.one_of(valid, corrupted, truncated, st.binary(max_size=128))


def _content_type(response: Any) -> str:
    return (response.headers.get("content-type") or [""])[0]


def _error_shape_problem(response: Any) -> str | None:
    """The one shape; on the Confluent v2 dialect's paths, Confluent's (an integer code, its media type)."""
    confluent = is_confluent_path(urlsplit(response.request.url).path)
    expected = "application/vnd.kafka.v2+json" if confluent else "application/json"
    if not _content_type(response).startswith(expected):
        return f"error answer is not {expected}: {_content_type(response)!r}"
    try:
        body = json.loads(response.content)
    except ValueError:
        return "error answer is not valid JSON"
    code_type = int if confluent else str
    if not isinstance(body, dict) or not isinstance(body.get("error_code"), code_type) \
            or not isinstance(body.get("message"), str):
        return f"error answer lacks {{error_code ({code_type.__name__}), message}}"
    if "Traceback" in body["message"]:
        return "error message carries a traceback"
    return None


def _error_body(response: Any) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _state_dependent_400(case: Any, response: Any) -> bool:
    """Whether a 400 is one only the cluster's state decides (STATE_DEPENDENT_400)."""
    body = _error_body(response)
    label = f"{case.operation.method.upper()} {case.operation.path}"
    return response.status_code == 400 and any(
        body.get("error_code") == code and operation in (None, label) and fragment in str(body.get("message"))
        for code, operation, fragment in STATE_DEPENDENT_400)


def _integers(value: Any) -> Any:
    """`value` with integral floats (4.0, 1e3) as integers, everywhere in it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: _integers(item) for key, item in value.items()}
    return value


def _one_window(body: Any) -> Any:
    """A produce body's record timestamps within 2^31 ms before now, the default of a record
    without one: a batch stores them as 32-bit deltas from the earliest, and the document
    cannot say that one field bounds another."""
    records = body.get("records") if isinstance(body, dict) else None
    if not isinstance(records, list):
        return body
    now_ms = int(time.time() * 1000)
    return {**body, "records": [
        {**r, "timestamp": now_ms - r["timestamp"] % 2**31}
        if isinstance(r, dict) and _is_int(r.get("timestamp")) else r for r in records]}


def _describe(case: Any, response: Any, problem: str) -> str:
    lines = [problem, f"  operation: {case.method.upper()} {case.path}"]
    if response is not None:
        request = response.request
        body = request.body[:300] if isinstance(request.body, bytes | str) else request.body
        lines += [f"  request: {request.method} {request.url}",
                  f"  content-type: {request.headers.get('Content-Type')}", f"  body: {body!r}",
                  f"  response: {response.status_code} {_content_type(response)} {response.content[:300]!r}"]
    return "\n".join(lines)


def _generated_inputs(operation: Any, fixed: dict[str, Any] | None) -> list[str]:
    """The inputs left to the generator (the ones negative mode can make invalid)."""
    names = [f"{p.location}:{p.name}" for p in operation.iter_parameters() if p.name not in (fixed or {})]
    return names + (["body"] if len(operation.body) else [])


def _checks() -> tuple[Any, ...]:
    from schemathesis.specs.openapi import checks

    return (checks.status_code_conformance, checks.content_type_conformance, checks.response_schema_conformance,
            checks.negative_data_rejection, checks.positive_data_acceptance, checks.missing_required_header,
            checks.unsupported_method)


def _exercise(case: Any, variant: str, base_urls: list[str], session: Any, findings: Findings) -> None:
    """Send one case to the next node in turn and record what is wrong with the answer."""
    import requests
    from schemathesis.core.failures import FailureGroup

    if time.monotonic() > findings.deadline:
        return
    stat = findings.stat(variant)
    method_path = (case.operation.method.upper(), case.operation.path)
    base_url = base_urls[stat["cases"] % len(base_urls)]
    stat["cases"] += 1
    try:
        response = case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S)
    except requests.RequestException as error:
        findings.add((variant, "transport", type(error).__name__), _describe(case, None, f"no answer: {error}"))
        return
    if method_path == ("POST", "/v1/topics") and response.status_code == 201:
        findings.created_topics.add(json.loads(response.content)["name"])
    status = response.status_code
    stat["statuses"][str(status)] = stat["statuses"].get(str(status), 0) + 1
    sent = str(response.request.headers.get("Content-Type"))
    stat["sent"][sent] = stat["sent"].get(sent, 0) + 1
    if status >= 500 and DOCUMENTED_5XX.get(method_path) != status:
        findings.add((variant, "5xx", str(status)), _describe(case, response, f"server error {status}"))
    if status >= 400 and (problem := _error_shape_problem(response)) is not None:
        findings.add((variant, "shape", problem), _describe(case, response, problem))
    for check in _checks():
        try:
            case.validate_response(response, checks=[check],
                                   transport_kwargs={"base_url": base_url, "session": session})
        except FailureGroup as group:  # the document and the answer disagree
            for failure in group.exceptions:
                if check.__name__ == "positive_data_acceptance" and _state_dependent_400(case, response):
                    continue
                findings.add((variant, check.__name__, failure.title),
                             _describe(case, response, f"{check.__name__}: {failure.title}: {failure.message}"))


def _fuzz_variant(operation: Any, mode: Any, fixed: dict[str, Any] | None, base_urls: list[str], session: Any,
                  findings: Findings) -> None:
    from hypothesis import HealthCheck, Phase, given, seed, settings

    variant = f"{operation.method.upper()} {operation.path} [{mode.value}{', real topic' if fixed else ''}]"
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed)

    @seed(SEED)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy.map(_bounded))
    def run(case: Any) -> None:
        _exercise(case, variant, base_urls, session, findings)

    started = time.monotonic()
    run()
    findings.stat(variant)["seconds"] += time.monotonic() - started


def _coverage_variant(schema: Any, operation: Any, base_urls: list[str], session: Any, findings: Findings) -> None:
    """schemathesis' coverage phase: boundary values, each missing parameter or required
    property, wrong types, undeclared methods (405 with Allow), wrong media types. Its
    cases are the only ones `missing_required_header` and `unsupported_method` judge."""
    from schemathesis import GenerationMode

    variant = f"{operation.method.upper()} {operation.path} [coverage]"
    generation = schema.config.generation_for(operation=operation, phase="coverage")
    started = time.monotonic()
    for case in schema.iter_coverage_cases(operation, generation_config=generation,
                                           generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE]):
        _exercise(_bounded(case), variant, base_urls, session, findings)
    findings.stat(variant)["seconds"] += time.monotonic() - started


def _config() -> Any:
    """What the checks expect beyond schemathesis' defaults (see the module docstring)."""
    from schemathesis.config import SchemathesisConfig

    return SchemathesisConfig.from_dict({"checks": {
        "positive_data_acceptance": {"expected-statuses": POSITIVE_STATUSES},
        "negative_data_rejection": {"expected-statuses": NEGATIVE_STATUSES},
    }})


def fuzz(base_urls: list[str], budget_s: float) -> dict[str, Any]:
    """The whole pass (synchronous, in the child process): the findings as JSON-ready data."""
    import requests
    import schemathesis
    from schemathesis import GenerationMode

    started = time.monotonic()
    findings = Findings(deadline=started + budget_s)
    schemathesis.openapi.media_type(BATCH_CONTENT_TYPE, _batch_bodies())
    labels = []
    with requests.Session() as session:
        document = session.get(f"{base_urls[0]}/v1/openapi.json", timeout=REQUEST_TIMEOUT_S).json()
        schema = schemathesis.openapi.from_dict(document, config=_config())
        for result in schema.get_all_operations():
            operation = result.ok()
            labels.append(f"{operation.method.upper()} {operation.path}")
            _coverage_variant(schema, operation, base_urls, session, findings)
            fixed_variants: list[dict[str, Any] | None] = [None]
            if "{topic}" in operation.path and operation.method.upper() != "DELETE":
                fixed_variants.append({"topic": FUZZ_TOPIC})
            if "{instance}" in operation.path and not (operation.method.upper() == "DELETE"
                                                       and operation.path.endswith("{instance}")):
                fixed_variants.append({"group": FUZZ_GROUP, "instance": FUZZ_INSTANCE})
            for fixed in fixed_variants:
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    if mode is GenerationMode.NEGATIVE and not _generated_inputs(operation, fixed):
                        continue  # nothing left to make invalid: no negative case exists
                    _fuzz_variant(operation, mode, fixed, base_urls, session, findings)
            for topic in sorted(findings.created_topics):
                answer = session.delete(f"{base_urls[0]}/v1/topics/{topic}", timeout=REQUEST_TIMEOUT_S)
                if answer.status_code not in (204, 404):
                    findings.add(("cleanup", topic), f"deleting {topic}: {answer.status_code} {answer.text}")
            findings.created_topics.clear()
            if operation.path.endswith("/drain"):  # a drained node of the shared cluster leads again
                for listed in session.get(f"{base_urls[0]}/v1/cluster", timeout=REQUEST_TIMEOUT_S).json()["nodes"]:
                    answer = session.delete(f"{base_urls[0]}/v1/admin/nodes/{listed['node_id']}/drain",
                                            timeout=REQUEST_TIMEOUT_S)
                    if answer.status_code != 200:
                        findings.add(("cleanup", "undrain"), f"undraining {listed}: {answer.status_code}")
            if operation.path == "/v1/admin/config":  # every node back to its own move throttle
                answer = session.patch(f"{base_urls[0]}/v1/admin/config", json={"replica_move_bytes_per_s": None},
                                       timeout=REQUEST_TIMEOUT_S)
                if answer.status_code != 200:
                    findings.add(("cleanup", "config"), f"resetting the cluster config: {answer.status_code}")
            if operation.path.endswith("/decommission"):  # refused, as the docstring says; cleaned up anyway
                for listed in session.get(f"{base_urls[0]}/v1/cluster", timeout=REQUEST_TIMEOUT_S).json()["nodes"]:
                    if listed["decommissioning"]:
                        findings.add(("decommission", "accepted"), f"node {listed['node_id']} was decommissioning")
                        session.delete(f"{base_urls[0]}/v1/admin/nodes/{listed['node_id']}/decommission",
                                       timeout=REQUEST_TIMEOUT_S)
    return {"labels": labels, "failures": findings.failures, "stats": findings.stats,
            "elapsed": time.monotonic() - started, "out_of_time": time.monotonic() > findings.deadline}


async def test_fuzz_from_openapi_document_no_5xx(cluster: Cluster) -> None:
    await cluster.create_topic(FUZZ_TOPIC, partitions=FUZZ_TOPIC_PARTITIONS)
    status, _ = await cluster.call("POST", 0, f"/v1/topics/{FUZZ_TOPIC}/records",
                                   json={"records": [{"key": str(i), "value": i} for i in range(10)]})
    assert status == 200
    for path, body in ((f"/consumers/{FUZZ_GROUP}", {"name": FUZZ_INSTANCE, "format": "json",
                                                       "consumer.request.timeout.ms": 0}),
                       (f"/consumers/{FUZZ_GROUP}/instances/{FUZZ_INSTANCE}/subscription", {"topics": [FUZZ_TOPIC]})):
        async with cluster.session.post(cluster.url(1, path), json=body,
                                        headers={"Content-Type": "application/vnd.kafka.v2+json"}) as answer:
            assert answer.status in (200, 204), await answer.text()
    _, document = await cluster.call("GET", 0, "/v1/openapi.json")
    documented = sorted(f"{method.upper()} {path}" for path, item in document["paths"].items()
                        for method in item if method in ("get", "post", "put", "patch", "delete"))
    members = {n.node_id: (n.raft_addr, n.http_addr) for n in cluster.nodes[0].catalog.nodes.values()}
    arguments = json.dumps({"base_urls": [s.url for s in cluster.servers], "budget_s": FUZZ_BUDGET_S})

    started = time.monotonic()
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.http.test_fuzz", arguments, cwd=REPO,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(child.communicate(), FUZZ_BUDGET_S + 2 * REQUEST_TIMEOUT_S)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    elapsed = time.monotonic() - started
    assert child.returncode == 0, f"the fuzz process failed:\n{stderr.decode()[-5000:]}"
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    await until(lambda: all(FUZZ_TOPIC in n.catalog.topics for n in cluster.nodes), "the fuzz topic survives")
    for node in cluster.nodes:  # no admission went through: no node added, no address changed
        assert {n.node_id: (n.raft_addr, n.http_addr) for n in node.catalog.nodes.values()} == members

    print(f"\nfuzz: {sum(s['cases'] for s in result['stats'].values())} cases over {len(result['labels'])} "
          f"operations in {elapsed:.1f} s (fuzzing {result['elapsed']:.1f} s)")
    for variant, stat in sorted(result["stats"].items()):
        print(f"  {stat['cases']:3d} {stat['seconds']:5.1f} s  {variant}  answers {stat['statuses']}")
    failures = result["failures"]
    assert not failures, f"{len(failures)} distinct failures:\n\n" + "\n\n".join(failures.values())
    assert not result["out_of_time"], f"the pass ran out of its {FUZZ_BUDGET_S:.0f} s; not every case ran"
    assert sorted(result["labels"]) == documented, "every documented operation is fuzzed"
    ran = {variant.partition(" [")[0] for variant, stat in result["stats"].items() if stat["cases"]}
    assert ran == set(documented), f"operations without a case: {set(documented) - ran}"
    batches = sum(s["sent"].get(BATCH_CONTENT_TYPE, 0) for s in result["stats"].values())
    print(f"  binary batch bodies sent: {batches}")
    assert batches > 0, "the binary batch media type is fuzzed too"


if __name__ == "__main__":  # the child process of the test above
    parameters = json.loads(sys.argv[1])
    print(json.dumps(fuzz(parameters["base_urls"], parameters["budget_s"])))
