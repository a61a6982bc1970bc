# HTTP+SSE: a GET stream announces an endpoint; 64 POSTs of a batch of N requests (all with
# id 1, so the session's in-flight table holds one id) are answered 202 and parked in the
# session; then M POSTs of one request each answered 202 (not parked: the parked list is
# full) end unanswered. Each end takes the id out of the in-flight table and recharges the
# session, which adds up the cost of every parked request: M x 64N.
# usage: g_parked.py OUT N M
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(5); out, N, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = P(out)
a = Conn(p, 1)
a.c2s(b'GET /sse HTTP/1.1\r\nHost: s\r\nAccept: text/event-stream\r\n\r\n')
a.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n'
      b'event: endpoint\ndata: /messages?sessionId=abc\n\n')
b = Conn(p, 2)
path = b'/messages?sessionId=abc'
def post(body):
    b.c2s(b'POST %s HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % (path, len(body)) + body, mss=60000)
    b.s2c(b'HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\n\r\nAccepted')
batch = b'[' + b','.join([b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'] * N) + b']'
for _ in range(64):
    post(batch)
for j in range(M):
    post(b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}' % (j + 2))
p.close()
