#!/usr/bin/env python3
"""Pipelined gzip-compressed MCP requests and answers, each body ~MB decompressed and ~26 KB on
the wire (within the 200x guard): the case where flow shards stage far more than their frames
(docs/sharding.md, step 3, "Staged steps and the budget"). `gzip_bodies.py gz.pcap 1500 3.8 8`
writes 83 MB; then `mcptap replay --threads 3 --flow-threads 2 --memory-budget-bytes 16777216 gz.pcap`.

usage: gzip_bodies.py OUT NREQ MB_PER_BODY NCONN"""
import sys, zlib, json, struct, gzip
sys.argv_ = sys.argv
OUT, NREQ, MB, NC = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
sys.argv = [sys.argv[0], 'none', OUT]
import os
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile_pcaps.py')).read().split("T0 = ")[0])  # reuse helpers (writes header)
T0 = 1_700_000_000 * 10**9
import random as _r
_r.seed(1)
pad = ''.join(('A'*400 + _r.choice('0123456789abcdef')) for _ in range(int(MB * (1 << 20))//401))
def zreq(id_, sid):
    body = json.dumps({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "t", "arguments": {"x": pad}}}).encode()
    z = gzip.compress(body, 9)
    h = b'POST /mcp HTTP/1.1\r\nHost: s\r\naccept: application/json, text/event-stream\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\nmcp-session-id: ' + sid.encode() + b'\r\n'
    return h + b'Content-Length: %d\r\n\r\n' % len(z) + z
def zresp(id_):
    body = json.dumps({"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "text", "text": pad}]}}).encode()
    z = gzip.compress(body, 9)
    return b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n' % len(z) + z
R = zreq(1, 'x'); P = zresp(1)
print('req bytes', len(R), 'resp bytes', len(P), file=sys.stderr)
t = T0
conns = []
for j in range(NC):
    c = Conn(client(j), 30000 + j); t = session(c, t, j, 1); conns.append(c)
k = 0
for i in range(NREQ):
    c = conns[i % NC]; sid = 'sess%08d' % (i % NC)
    t = c.send(t + 10, zreq(1000 + i, sid))
    t = c.send(t + 10, zresp(1000 + i), False)
for c in conns: c.fin(t)
f.close()
