#!/usr/bin/env python3
"""Compares the facts mcptap and tshark extracted from the same capture.

The fact: for every tools/call request answered on the wire, its session id (from the
request's Mcp-Session-Id header) and the media type of the HTTP response (sse, json or
other). mcptap reports it per JSON-RPC exchange (NDJSON "exchange" events); tshark only sees
HTTP, so its rows are joined here: request frame (JSON body -> method, session header) <-
response frame (http.request_in, Content-Type).

usage: facts.py MCPTAP_EVENTS.ndjson TSHARK_FIELDS.tsv
Prints one line; exit status 0 when both multisets are identical, 1 otherwise.
tshark fields, '|'-separated: frame.number, http.request.method, http.request_in,
http.response.code, http.content_type, http.header.mcp-session-id, json.member_with_value.
"""
import collections
import json
import sys


def media(content_type):
    mt = content_type.split(";")[0].strip().lower()
    if mt == "text/event-stream":
        return "sse"
    if mt == "application/json" or mt.endswith("+json"):
        return "json"
    return "other" if mt else "none"


def mcptap_facts(path):
    facts = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            ev = json.loads(line)
            if ev.get("event") != "exchange" or ev.get("method") != "tools/call":
                continue
            if ev.get("http_status") in (None, 0):
                continue  # never answered at the HTTP level
            facts[(ev.get("session_id") or "", ev["media_type"])] += 1
    return facts


def tshark_facts(path):
    requests = {}
    responses = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            cols = line.rstrip("\n").split("|")
            if len(cols) < 7:
                continue
            frame, method, request_in, code, ctype, sid, members = cols[:7]
            # Several requests in one frame (pipelining) give comma-joined values; the
            # generated captures have one message per frame for MCP requests.
            if method:
                rpc = ""
                for m in members.split(","):
                    if m.startswith("method:"):
                        rpc = m[len("method:"):]
                        break
                requests[frame] = (rpc, sid.split(",")[0])
            elif code and request_in:
                responses.append((request_in.split(",")[0], ctype.split(",")[0]))
    facts = collections.Counter()
    for request_in, ctype in responses:
        rpc, sid = requests.get(request_in, ("", ""))
        if rpc == "tools/call":
            facts[(sid, media(ctype))] += 1
    return facts


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours = mcptap_facts(sys.argv[1])
    theirs = tshark_facts(sys.argv[2])

    def by_media(c):
        m = collections.Counter()
        for (_, med), n in c.items():
            m[med] += n
        return " ".join(f"{k}={v}" for k, v in sorted(m.items())) or "-"

    same = ours == theirs
    diff = (ours - theirs) + (theirs - ours)
    print(
        f"tools/call responses: mcptap {sum(ours.values())} ({by_media(ours)}), "
        f"tshark {sum(theirs.values())} ({by_media(theirs)}); "
        f"per (session id, media type): {'identical' if same else f'DIFFER on {sum(diff.values())}'}"
    )
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
