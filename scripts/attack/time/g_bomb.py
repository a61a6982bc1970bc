# Request bodies that inflate about 1000:1 (gzip): each POST carries a JSON-RPC request whose
# string param decodes to D bytes (below the bomb guard's free first MiB and the 4 MiB message
# cap), answered 200 JSON. R requests, pipelined on C connections of R/C each.
# usage: g_bomb.py OUT D R [C [SPACING]]
import sys, os, random, zlib; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(10); out, D, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
C = int(sys.argv[4]) if len(sys.argv) > 4 else 1
# SPACING > 0: a random letter every SPACING bytes, to stay under the guard's 200:1 ratio.
SP = int(sys.argv[5]) if len(sys.argv) > 5 else 0
fill = b''.join(b'a' * SP + bytes([random.randrange(97, 123)]) for _ in range(D // (SP + 1))) if SP else b'a' * D
plain = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":"' + fill + b'"}}}'
z = zlib.compressobj(9, zlib.DEFLATED, 31); body = z.compress(plain) + z.flush()
req = b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nMcp-Session-Id: s1\r\nContent-Length: %d\r\n\r\n' % len(body) + body
resp = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}'
p = P(out)
for c in range(C):
    k = Conn(p, c)
    for _ in range(R // C):
        k.c2s(req, mss=60000); k.s2c(resp)
    k.fin()
p.close()
print(len(body), len(plain))
