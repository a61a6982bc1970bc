# N requests pipelined on one connection (in segments of up to 60 KB), then their N answers.
# usage: g_pipeline.py OUT N [C]   (C connections, default 1)
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(8); out, N = sys.argv[1], int(sys.argv[2])
C = int(sys.argv[3]) if len(sys.argv) > 3 else 1
p = P(out)
for c in range(C):
    k = Conn(p, c)
    reqs, resps = [], []
    for i in range(N):
        body = b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}' % i
        reqs.append(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
        r = b'{"jsonrpc":"2.0","id":%d,"result":{}}' % i
        resps.append(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(r) + r)
    k.c2s(b''.join(reqs), mss=60000)
    k.s2c(b''.join(resps), mss=60000)
    k.fin()
p.close()
