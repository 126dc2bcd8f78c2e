"""Who may call which route, when the node requires bearer tokens (multiraft/metadata/auth.py).

One table, by route (method and path pattern), of the right each needs, so a new
route cannot be forgotten: a route missing from `RULES` needs `admin`. The checks
that depend on a body or on state (a consumer-group commit names its topics in
its body; a member acts on the topics of its subscription) are made by their
handlers through `require` and `require_subscription`.

Consumer groups follow Kafka's ACLs with the rights we have: Kafka asks for READ on
the group for a join, heartbeat, fetch, commit or leave, and DESCRIBE on it for a
describe or a list. Rights here are per topic, so a group's READ is `read` on each
topic the member subscribes to (`read:*` for a glob: it reaches topics not named
yet), and its DESCRIBE is `read` on every topic any of its members subscribes to.
A member id is the member's proof of membership (KIP-848's member id is the
client's to keep): it goes only to the joiner, and describe shows ids and epochs
only to `admin` (docs/http.md, "Consumer group members").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from multiraft.errors import NotAuthorized, Unauthenticated
from multiraft.http.errors import NODE_KEY
from multiraft.metadata.auth import Principal, authenticate

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL_KEY: web.RequestKey[Principal] = web.RequestKey("principal", Principal)

OPEN = "open"  # no token needed
ANY = "any"  # any valid token
ADMIN_RIGHT = "admin"
READ_PATH, WRITE_PATH = "read:path", "write:path"  # on the topic in the path
READ_QUERY = "read:query"  # on the topic in the query
WRITE_SOME = "write:some"  # a write right on some topic
IN_HANDLER = "handler"  # any valid token here; the handler checks the topics of its body

RULES: dict[tuple[str, str], str] = {
    ("GET", "/v1/health"): OPEN,
    ("GET", "/v1/openapi.json"): OPEN,
    ("GET", "/v1/cluster"): ANY,
    ("GET", "/v1/topics"): ANY,
    ("GET", "/v1/topics/{topic}"): ANY,
    ("GET", "/metrics"): ANY,
    ("GET", "/ui"): ANY,
    ("POST", "/v1/topics/{topic}/records"): WRITE_PATH,
    ("POST", "/v1/topics/{topic}/partitions/{partition}/records"): WRITE_PATH,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records"): READ_PATH,
    ("GET", "/v1/topics/{topic}/partitions/{partition}/log"): READ_PATH,  # a mirror's read (docs/mirror.md)
    ("GET", "/v1/topics/{topic}/partitions/{partition}/tree"): READ_PATH,  # a mirror's full sync
    ("GET", "/v1/topics/{topic}/partitions/{partition}/tree/nodes"): READ_PATH,
    ("POST", "/v1/producers"): WRITE_SOME,
    ("GET", "/v1/groups/{group}/offsets"): READ_QUERY,
    ("POST", "/v1/groups/{group}/offsets"): IN_HANDLER,
    # Kafka asks for DELETE on the group resource; rights here are per topic, and a delete
    # reaches every topic the group has offsets in, which the caller cannot name in advance
    # and may not be allowed to read. Only admin covers them all.
    ("DELETE", "/v1/groups/{group}"): ADMIN_RIGHT,
    # A reset moves where every future member starts, on every topic it names (Kafka asks
    # for READ on the group and the topics; our rights have no group resource): admin.
    ("POST", "/v1/groups/{group}/offsets/reset"): ADMIN_RIGHT,
    # Live operations (issue 25): more partitions (Kafka's ALTER on the topic: admin here), drain.
    ("POST", "/v1/topics/{topic}/partitions"): ADMIN_RIGHT,
    ("POST", "/v1/admin/nodes/{node}/drain"): ADMIN_RIGHT,
    ("DELETE", "/v1/admin/nodes/{node}/drain"): ADMIN_RIGHT,
    ("GET", "/v1/admin/nodes/{node}/decommission"): ADMIN_RIGHT,
    ("GET", "/v1/admin/config"): ADMIN_RIGHT,
    ("POST", "/v1/admin/nodes/{node}/promote"): ADMIN_RIGHT,
    ("PATCH", "/v1/admin/config"): ADMIN_RIGHT,
    ("POST", "/v1/admin/nodes/{node}/decommission"): ADMIN_RIGHT,
    ("DELETE", "/v1/admin/nodes/{node}/decommission"): ADMIN_RIGHT,
    # The cluster's feature level (multiraft/node/features.py): a finalize is not undone.
    ("GET", "/v1/admin/features"): ADMIN_RIGHT,
    ("POST", "/v1/admin/features"): ADMIN_RIGHT,
    # Membership: a join names its topics in the body (read on each; a pattern needs read:*);
    # a member's later calls need the same on the member's subscription (the group state's);
    # describe needs read on every member's, and a list shows only the groups so described.
    ("POST", "/v1/groups/{group}/members"): IN_HANDLER,
    ("POST", "/v1/groups/{group}/members/{member}/heartbeat"): IN_HANDLER,
    ("POST", "/v1/groups/{group}/members/{member}/records"): IN_HANDLER,
    ("DELETE", "/v1/groups/{group}/members/{member}"): IN_HANDLER,
    ("GET", "/v1/groups/{group}"): IN_HANDLER,
    ("GET", "/v1/groups"): IN_HANDLER,
    # The Confluent REST v2 dialect: the same rights as the native routes. A consumer
    # instance is a group member: creating one needs read on some topic, and only the token
    # that created it (or admin) drives it; its later calls need read on its subscription
    # (or its manual assignment), and on the topics a call names (confluent_consumers.py).
    ("GET", "/topics"): ANY,
    ("GET", "/topics/{topic}"): ANY,
    ("GET", "/topics/{topic}/partitions"): ANY,
    ("GET", "/topics/{topic}/partitions/{partition}"): ANY,
    ("GET", "/brokers"): ANY,
    ("POST", "/topics/{topic}"): WRITE_PATH,
    ("POST", "/topics/{topic}/partitions/{partition}"): WRITE_PATH,
    ("GET", "/topics/{topic}/partitions/{partition}/offsets"): READ_PATH,
    ("POST", "/consumers/{group}"): IN_HANDLER,
    ("DELETE", "/consumers/{group}/instances/{instance}"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/subscription"): IN_HANDLER,
    ("GET", "/consumers/{group}/instances/{instance}/subscription"): IN_HANDLER,
    ("DELETE", "/consumers/{group}/instances/{instance}/subscription"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/assignments"): IN_HANDLER,
    ("GET", "/consumers/{group}/instances/{instance}/assignments"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/positions"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/positions/beginning"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/positions/end"): IN_HANDLER,
    ("GET", "/consumers/{group}/instances/{instance}/records"): IN_HANDLER,
    ("POST", "/consumers/{group}/instances/{instance}/offsets"): IN_HANDLER,
    ("GET", "/consumers/{group}/instances/{instance}/offsets"): IN_HANDLER,
}


def rule_for(method: str, path: str) -> str:
    return RULES.get((method, path), ADMIN_RIGHT)


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    if not node.config.admin_token:
        return await handler(request)
    resource = request.match_info.route.resource
    rule = rule_for(request.method, resource.canonical) if resource is not None else ANY
    if rule == OPEN:
        return await handler(request)
    principal = authenticate(request.headers.get("Authorization"), node.config.admin_token,
                             node.catalog.token_by_digest)
    if principal is None:
        raise Unauthenticated("this node requires a bearer token: Authorization: Bearer TOKEN")
    request[PRINCIPAL_KEY] = principal
    if rule == ADMIN_RIGHT:
        _check(principal, "admin", None, "this needs the admin right")
    elif rule in (READ_PATH, WRITE_PATH):
        topic = request.match_info.get("topic", "")
        _check(principal, rule.partition(":")[0], topic, f"this needs {rule.partition(':')[0]}:{topic}")
    elif rule == READ_QUERY:
        topic = request.query.get("topic", "")
        _check(principal, "read", topic, f"this needs read:{topic}")
    elif rule == WRITE_SOME:
        _check(principal, "write", None, "this needs a write right on some topic")
    return await handler(request)


def require_admin(request: web.Request) -> None:
    """A handler's own check for the admin right (a body asked for an admin act); a no-op without auth."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is not None:
        _check(principal, "admin", None, "this needs the admin right")


def _check(principal: Principal, action: str, topic: str | None, message: str) -> None:
    if not principal.may(action, topic):
        raise NotAuthorized(f"token {principal.name!r} may not do this: {message}")


def require(request: web.Request, action: str, topic: str) -> None:
    """A handler's own check (on a topic named in the body); a no-op without auth."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is not None:
        _check(principal, action, topic, f"this needs {action}:{topic}")


def auth_on(request: web.Request) -> bool:
    """Whether this request was authenticated (the node requires tokens)."""
    return request.get(PRINCIPAL_KEY) is not None


def is_admin(request: web.Request) -> bool:
    """The admin right, or no auth at all (then everyone sees everything, as before auth)."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    return principal is None or principal.is_admin


def may_read_all(request: web.Request, topics: Iterable[str], pattern: bool) -> bool:
    """Whether the token may read every one of `topics` (and every topic, for a pattern)."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is None:
        return True
    if pattern and not principal.may("read", "*"):
        return False
    return all(principal.may("read", topic) for topic in topics)


def require_subscription(request: web.Request, topics: Iterable[str], pattern: bool) -> None:
    """A consumer group's READ (or DESCRIBE): read on each topic, `read:*` for a pattern."""
    principal: Principal | None = request.get(PRINCIPAL_KEY)
    if principal is None:
        return
    if pattern:
        _check(principal, "read", "*", "this needs read:* (a topic pattern reaches every topic)")
    for topic in sorted(set(topics)):
        _check(principal, "read", topic, f"this needs read:{topic}")
