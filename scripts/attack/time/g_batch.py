# A JSON-RPC batch of R requests answered in order by a batch of R results (one connection,
# one session); C such exchanges. Probes per-answer work that scans the batch.
# usage: g_batch.py OUT R [C] [mode]   mode: inorder (default) | reverse | sameid | nosid
# (nosid: no Mcp-Session-Id, a stateless legacy server; methods differ per request)
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(2); out, R = sys.argv[1], int(sys.argv[2])
C = int(sys.argv[3]) if len(sys.argv) > 3 else 1
mode = sys.argv[4] if len(sys.argv) > 4 else 'inorder'
p = P(out)
for c in range(C):
    k = Conn(p, c)
    ids = list(range(R))
    rid = (lambda i: 7) if mode == 'sameid' else (lambda i: i)
    sid = b'' if mode == 'nosid' else b'Mcp-Session-Id: s%d\r\n' % c
    meth = (lambda i: b'm%d' % (i % 50)) if mode == 'nosid' else (lambda i: b'tools/list')
    body = b'[' + b','.join(b'{"jsonrpc":"2.0","id":%d,"method":"%s"}' % (rid(i), meth(i)) for i in ids) + b']'
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n' + sid + b'Content-Length: %d\r\n\r\n' % len(body) + body, mss=60000)
    order = ids[::-1] if mode == 'reverse' else ids
    resp = b'[' + b','.join(b'{"jsonrpc":"2.0","id":%d,"result":{}}' % rid(i) for i in order) + b']'
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(resp) + resp, mss=60000)
    k.fin()
p.close()
