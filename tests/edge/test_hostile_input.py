"""Hostile input at the edge's door, against a real edge process (test-double engines behind it):
Hypothesis-generated JSON bodies and raw HTTP over sockets, plus the named attacks (slowloris,
short bodies, unterminated chunked bodies, huge and many headers, no Host, deep nesting, bodies
without credentials, connection floods, 401 floods).

Every case must get a 4xx (or a 200), never a 5xx; no connection may outlive its timeout; and the
edge must serve normally afterwards."""

from __future__ import annotations

import json
import socket
import string
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.edge.hostile import (
    connect,
    fuzz_edge,
    json_error,
    read_until_closed,
    request,
    send_quietly,
    statuses,
)

FUZZ = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
# Header 0.5 s, body 0.5 s, keep-alive 1 s, sweeper granularity 0.1 s: nothing outlives 1.1 s;
# the slack is for a loaded CI machine.
CLOSE_WITHIN = 2.5


@pytest.fixture(scope="module")
def fz(tmp_path_factory):
    with fuzz_edge(tmp_path_factory.mktemp("fuzz-edge")) as edge:
        yield edge


# ------------------------------------------------------------------ JSON bodies (Hypothesis)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=12)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
          "stream", "stream_options", "stop", "stop_token_ids", "seed", "user", "logprobs", "top_logprobs",
          "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "presence_penalty",
          "frequency_penalty", "response_format", "tools", "tool_choice", "priority", "ignore_eos", "echo",
          "suffix", "best_of", "regex", "metadata", "skip_special_tokens"]
roles = st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer", "function"]), json_values)
contents = st.one_of(st.text(max_size=30), json_values,
                     st.lists(st.fixed_dictionaries({"type": st.one_of(st.just("text"), json_values)},
                                                    optional={"text": json_values}), max_size=3))
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": contents, "name": json_values, "tool_calls": json_values, "tool_call_id": json_values}), max_size=3)


# Values of the right type (often out of range), so that bodies also get past validation to the engine.
PLAUSIBLE = {
    "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5), "n": st.integers(0, 3),
    "max_tokens": st.integers(-1, 9000), "stream": st.booleans(), "stop": st.one_of(st.text(max_size=5),
    st.lists(st.text(max_size=5), max_size=3)), "stop_token_ids": st.lists(st.integers(-5, 2**40), max_size=3),
    "seed": st.integers(-2**63, 2**64), "user": st.text(max_size=10), "top_k": st.integers(-2, 100),
    "min_p": st.floats(-1, 2), "logit_bias": st.dictionaries(st.text(max_size=4), st.floats(-100, 100), max_size=2),
    "ignore_eos": st.booleans(), "priority": st.sampled_from(["interactive", "batch", "urgent"]),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "x"])}),
    "min_tokens": st.integers(-1, 10), "repetition_penalty": st.floats(0, 3), "metadata": st.just({"a": "b"}),
}


def _nest(depth: int) -> bytes:
    """JSON text nested ``depth`` deep, objects and arrays alternating."""
    opens = b"".join(b"[" if i % 2 else b'{"k":' for i in range(depth))
    closes = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opens + b"1" + closes


@st.composite
def bodies(draw, chat: bool) -> bytes:
    base = ({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} if chat
            else {"model": "demo", "prompt": "hi", "max_tokens": 2})
    kind = draw(st.sampled_from(["plausible", "plausible", "mutate", "mutate", "messages", "deep", "scalar",
                                 "bytes"]))
    if kind == "bytes":  # not JSON, or not quite
        return draw(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                              st.just(json.dumps(base).encode()[:-1])))
    if kind == "scalar":  # JSON, but not an object
        return json.dumps(draw(json_values)).encode()
    body = dict(base)
    if kind == "plausible":
        for name in draw(st.lists(st.sampled_from(sorted(PLAUSIBLE)), max_size=5, unique=True)):
            body[name] = draw(PLAUSIBLE[name])
        return json.dumps(body).encode()
    if kind == "messages":
        body["messages" if chat else "prompt"] = draw(messages if chat else json_values)
    for name in draw(st.lists(st.sampled_from([*FIELDS, "x-extra"]), max_size=4, unique=True)):
        body[name] = draw(json_values)
    raw = json.dumps(body).encode()
    if kind == "deep":  # nesting on either side of the 64-level bound (the body is one level), in any field
        field = draw(st.sampled_from([*FIELDS, "extra"]))
        body.pop(field, None)
        raw = json.dumps(body).encode()[:-1] + b', "%s": ' % field.encode() + _nest(
            draw(st.sampled_from([62, 63, 64, 200, 5000]))) + b"}"
    return raw


def check_answer(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.endswith("data: [DONE]\n\n")
        else:
            assert r.json()["choices"]
        return
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    if r.status_code == 400 and err["code"] == "invalid_request":
        assert err["param"], err  # every type error names its parameter


@pytest.mark.parametrize(("path", "chat", "cases"), [("/v1/chat/completions", True, 600),
                                                      ("/v1/completions", False, 300)])
def test_generated_json_bodies_never_get_a_5xx(fz, path, chat, cases):
    seen: dict[int, int] = {}
    with httpx.Client(base_url=fz.url, timeout=10, headers={"authorization": f"Bearer {fz.key}",
                                                            "content-type": "application/json"}) as client:
        @settings(FUZZ, max_examples=cases)
        @given(bodies(chat))
        def one(raw: bytes) -> None:
            r = client.post(path, content=raw)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            check_answer(r)

        one()
    assert sum(seen.values()) >= cases
    assert seen.get(400, 0) > cases // 4 and seen.get(200, 0) > cases // 20, seen  # both sides were explored
    fz.serves_normally()


# ------------------------------------------------------------------ raw HTTP (Hypothesis)

token = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
header_value = st.one_of(st.text(string.ascii_letters + string.digits + " -;=,.", max_size=40),
                         st.text(string.printable, max_size=40))


@st.composite
def raw_requests(draw) -> bytes:
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"PRI", b"G\x00T", b""]))
    path = draw(st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/v1/models", b"/health",
                                 b"/metrics", b"/nope", b"*", b"http://x/health", b"/%00", b"/" + b"a" * 9000]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9", b"XYZ"]))
    headers: list[tuple[bytes, bytes]] = []
    if draw(st.integers(0, 3)):
        headers.append((b"Host", b"edge"))
    body = draw(st.sampled_from([b"", b'{"model":"demo","prompt":"x","max_tokens":1}', b"{", b"x" * 300]))
    framing = draw(st.sampled_from(["cl", "cl_short", "cl_long", "cl_bad", "cl_twice", "chunked", "chunked_open",
                                    "chunked_bad", "te_and_cl", "none"]))
    if framing == "cl":
        headers.append((b"Content-Length", b"%d" % len(body)))
    elif framing == "cl_short":
        headers.append((b"Content-Length", b"%d" % max(0, len(body) - 1)))
    elif framing == "cl_long":  # promises more than it sends: must time out, not wait forever
        headers.append((b"Content-Length", b"%d" % (len(body) + 10)))
    elif framing == "cl_bad":
        headers.append((b"Content-Length", draw(st.sampled_from([b"-1", b"abc", b"1e3", b"99999999999999999999"]))))
    elif framing == "cl_twice":
        headers += [(b"Content-Length", b"%d" % len(body)), (b"Content-Length", b"%d" % (len(body) + 1))]
    elif framing.startswith("chunked"):
        headers.append((b"Transfer-Encoding", b"chunked"))
        if framing == "chunked":
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        elif framing == "chunked_open":  # never terminated
            body = b"%x\r\n%s\r\n" % (len(body), body) if body else b"5\r\nab"
        else:
            body = draw(st.sampled_from([b"zz\r\nab\r\n", b"5\r\nabcdefgh\r\n0\r\n\r\n", b"-1\r\n\r\n"]))
    elif framing == "te_and_cl":  # smuggling shapes
        headers += [(b"Content-Length", b"3"), (b"Transfer-Encoding", draw(st.sampled_from(
            [b"chunked", b"chunked, identity", b" chunked", b"xchunked"])))]
    if draw(st.booleans()):
        headers.append((b"Authorization", draw(st.sampled_from([b"Bearer nope", b"Bearer ", b"Basic eA==",
                                                                b"bearer nmb_x_y"]))))
    for name, value in draw(st.lists(st.tuples(token, header_value), max_size=draw(st.sampled_from([0, 0, 4])))):
        headers.append((name.encode(), value.encode("latin-1", "replace")))
    headers = draw(st.permutations(headers))
    raw = request(method, path, headers, body, version)
    mangle = draw(st.sampled_from(["none"] * 6 + ["truncate", "lf_only", "garbage", "pipeline"]))
    if mangle == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif mangle == "lf_only":
        raw = raw.replace(b"\r\n", b"\n")
    elif mangle == "garbage":
        raw = draw(st.binary(min_size=1, max_size=200))
    elif mangle == "pipeline":
        raw = raw + request(b"GET", b"/health", [(b"Host", b"e")]) * draw(st.integers(1, 20))
    return raw


def test_raw_http_never_gets_a_5xx_and_no_connection_outlives_its_timeout(fz):
    sockets: list[tuple[socket.socket, bytes]] = []

    @settings(FUZZ, max_examples=600)
    @given(raw_requests())
    def one(raw: bytes) -> None:
        sock = connect(fz.port)
        send_quietly(sock, raw)
        sockets.append((sock, raw))

    one()
    assert len(sockets) >= 600
    time.sleep(CLOSE_WITHIN)  # every timeout (head, body, keep-alive, linger) has passed
    answered = {}
    for sock, raw in sockets:
        data, closed, _ = read_until_closed(sock, 0.2)
        sock.close()
        assert closed, f"connection still open after {CLOSE_WITHIN} s: sent {raw[:200]!r}, got {data[:200]!r}"
        codes = statuses(data)
        assert all(c < 500 for c in codes), (raw[:300], data[:500])
        for c in codes:
            answered[c] = answered.get(c, 0) + 1
    assert answered.get(400, 0) and answered.get(408, 0) and answered.get(200, 0), answered
    fz.serves_normally()


# ------------------------------------------------------------------ the named attacks


def test_slowloris_head_gets_408_within_the_header_timeout(fz):
    sock = connect(fz.port)
    t0 = time.monotonic()
    head = b"GET /health HTTP/1.1\r\nHost: e\r\nX-Slow: " + b"a" * 100
    sock.settimeout(0.05)
    data = b""
    for byte in head:  # one byte every 20 ms: far slower than the 0.5 s head deadline allows
        try:
            sock.send(bytes([byte]))
        except OSError:
            break
        try:
            data += sock.recv(4096)
        except TimeoutError:
            pass
        if data:
            break
        time.sleep(0.02)
    rest, closed, _ = read_until_closed(sock, 2.0)
    elapsed = time.monotonic() - t0
    assert statuses(data + rest) == [408]
    assert json_error(data + rest)["code"] == "request_timeout"
    assert closed and elapsed < 1.5


@pytest.mark.parametrize("body", [
    b"Content-Length: 100\r\n\r\n{\"model\":",  # shorter than promised
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",  # never terminated
    b"Transfer-Encoding: chunked\r\n\r\n",  # no chunk at all
])
def test_a_body_that_never_completes_gets_408_within_the_body_timeout(fz, body):
    sock = connect(fz.port)
    t0 = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer " + fz.key.encode() + b"\r\n"
                 + body)
    data, closed, _ = read_until_closed(sock, 3.0)
    assert statuses(data) == [408] and closed
    assert time.monotonic() - t0 < 1.5


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(fz):
    sock = connect(fz.port)
    data, closed, elapsed = read_until_closed(sock, 3.0)
    assert data == b"" and closed and elapsed < 1.5


@pytest.mark.parametrize(("what", "head"), [
    ("one huge header line", b"X-Big: " + b"a" * (16 << 20) + b"\r\n"),
    ("10,000 headers", b"".join(b"X-%d: v\r\n" % i for i in range(10_000))),
    ("101 headers", b"".join(b"X-%d: v\r\n" % i for i in range(101))),
    ("36 KiB of small headers", b"".join(b"X-%d: %s\r\n" % (i, b"v" * 400) for i in range(90))),
])
def test_oversized_heads_get_431(fz, what, head):
    sock = connect(fz.port)
    t0 = time.monotonic()
    send_quietly(sock, b"GET /health HTTP/1.1\r\nHost: e\r\n" + head + b"\r\n")
    data, closed, _ = read_until_closed(sock, 3.0)
    assert statuses(data) == [431], what
    assert json_error(data)["code"] == "headers_too_large"
    assert closed and time.monotonic() - t0 < 2.0


def test_a_long_url_gets_414(fz):
    sock = connect(fz.port)
    sock.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: e\r\n\r\n")
    data, closed, _ = read_until_closed(sock, 2.0)
    assert statuses(data) == [414] and closed


def test_http_11_needs_exactly_one_host(fz):
    for head in (b"GET /health HTTP/1.1\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"):
        sock = connect(fz.port)
        sock.sendall(head)
        data, closed, _ = read_until_closed(sock, 2.0)
        assert statuses(data) == [400] and closed, head
    sock = connect(fz.port)  # HTTP/1.0 has no Host requirement
    sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
    data, _, _ = read_until_closed(sock, 2.0)
    assert statuses(data) == [200]


@pytest.mark.parametrize("depth", [65, 1000, 40_000])
def test_deep_nesting_is_a_400_not_a_500(fz, depth):
    raw = b'{"model":"demo","prompt":"x","metadata":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
    r = httpx.post(fz.url + "/v1/completions", content=raw, headers={"authorization": f"Bearer {fz.key}"},
                   timeout=10)
    assert r.status_code == 400, r.text[:200]
    assert r.json()["error"]["code"] == "json_too_deep"


def test_nesting_within_the_bound_is_served(fz):
    raw = (b'{"model":"demo","messages":[{"role":"user","content":"x"}],"max_tokens":1,"metadata":'
           + b'{"a":' * 60 + b"1" + b"}" * 60 + b"}")
    r = httpx.post(fz.url + "/v1/chat/completions", content=raw, headers={"authorization": f"Bearer {fz.key}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("field", "value", "param"), [
    ("messages", [{"role": ["user"], "content": "x"}], "messages[0].role"),
    ("messages", [{"role": {"a": 1}, "content": "x"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": [{"type": ["text"]}]}], "messages[0].content[0]"),
    ("messages", [{"role": "user", "content": "x", "name": 5}], "messages[0].name"),
    ("stop_token_ids", 5, "stop_token_ids"),
    ("stop", {"a": 1}, "stop"),
    ("seed", "1", "seed"),
    ("logit_bias", [1], "logit_bias"),
    ("max_completion_tokens", "9", "max_completion_tokens"),
    ("priority", ["batch"], "priority"),
    ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
    ("model", ["demo"], "model"),
])
def test_type_errors_are_400s_naming_the_param(fz, field, value, param):
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    r = httpx.post(fz.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {fz.key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_no_credentials_gets_401_before_the_body_is_sent(fz):
    """The edge answers from the head: the client has not sent a byte of its (4 MB) body."""
    for auth in (b"", b"Authorization: Bearer nmb_wrong_key\r\n"):
        sock = connect(fz.port)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\n" + auth
                     + b"Content-Type: application/json\r\nContent-Length: 4000000\r\n\r\n")
        data, closed, elapsed = read_until_closed(sock, 2.0)
        assert statuses(data) == [401], data
        assert json_error(data)["type"] == "authentication_error"
        assert closed and elapsed < 1.0
    # with Expect: 100-continue the client is told no before it sends anything
    sock = connect(fz.port)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n")
    data, _, _ = read_until_closed(sock, 2.0)
    assert statuses(data) == [401]


def test_a_body_over_the_limit_gets_413_and_the_answer_arrives(fz):
    sock = connect(fz.port)
    big = b'{"model":"demo","prompt":"' + b"x" * (600 * 1024) + b'"}'
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nAuthorization: Bearer " + fz.key.encode()
                 + b"\r\nContent-Length: %d\r\n\r\n" % len(big))
    send_quietly(sock, big)
    data, closed, _ = read_until_closed(sock, 3.0)
    assert statuses(data) == [413] and closed  # not a reset that loses the answer
    assert json_error(data)["code"] == "request_too_large"


def test_pipelined_flood_is_answered_in_order_and_bounded(fz):
    sock = connect(fz.port)
    sock.sendall(request(b"GET", b"/health", [(b"Host", b"e")]) * 200)
    data, closed, _ = read_until_closed(sock, 3.0)
    codes = statuses(data)
    assert closed and codes and set(codes) == {200}
    assert 16 <= len(codes) < 200  # answered those it parsed ahead, then closed
    fz.serves_normally()


# ------------------------------------------------------------------ floods (their own edges)


def from_address(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10)


def test_connection_caps_shed_with_503_and_never_lock_out_other_addresses(tmp_path):
    with fuzz_edge(tmp_path, max_connections=40, max_connections_per_client=20, header_timeout_s=5.0) as edge:
        held = [connect(edge.port) for _ in range(20)]
        for s in held:  # half-sent requests from one address
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: e\r\n")
        time.sleep(0.2)
        over = connect(edge.port)
        data, closed, _ = read_until_closed(over, 3.0)
        assert statuses(data) == [503] and closed
        assert b"retry-after: 1" in data.lower()
        assert json_error(data)["code"] == "too_many_connections"
        # Another address is not locked out by the first one's flood...
        with from_address("127.0.0.2") as other:
            assert other.get(edge.url + "/health").status_code == 200
        more = [connect(edge.port, source="127.0.0.2") for _ in range(20)]
        time.sleep(0.2)
        # ...but the total cap holds for everyone, with the same answer.
        third = connect(edge.port, source="127.0.0.3")
        data, _, _ = read_until_closed(third, 3.0)
        assert statuses(data) == [503]
        for s in held + more:
            s.close()
        time.sleep(0.3)
        edge.serves_normally()


def test_unauthenticated_requests_are_throttled_per_address(tmp_path):
    with fuzz_edge(tmp_path, unauth_rate_per_s=1, unauth_burst=5) as edge:
        with httpx.Client(base_url=edge.url) as c:
            codes = [c.post("/v1/completions", json={"model": "demo", "prompt": "x"},
                            headers={"authorization": f"Bearer nmb_guess_{i}"}).status_code for i in range(12)]
            assert codes[:5] == [401] * 5
            assert codes[5:] == [429] * 7
            r = c.post("/v1/completions", json={"model": "demo", "prompt": "x"})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "too_many_auth_failures"
            # A valid key from the same address is still served; another address still gets its 401s.
            assert c.post("/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1},
                          headers={"authorization": f"Bearer {edge.key}"}).status_code == 200
        with from_address("127.0.0.2") as other:
            assert other.post(edge.url + "/v1/completions", json={"model": "demo", "prompt": "x"}).status_code == 401
        # GET /v1/models counts too
        assert httpx.get(edge.url + "/v1/models").status_code == 429
