# Request heads sent STEP bytes per segment: one head of H bytes (many headers) per
# connection, C connections, each then answered. usage: g_slowhead.py OUT H C [STEP]
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(7); out, H, C = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
STEP = int(sys.argv[4]) if len(sys.argv) > 4 else 1
p = P(out)
for c in range(C):
    k = Conn(p, c)
    head = b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\n'
    i = 0
    while len(head) < H - 40:
        head += b'X-Pad-%d: %s\r\n' % (i, b'v' * 200); i += 1
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    head += b'Content-Length: %d\r\n\r\n' % len(body)
    k.c2s(head, mss=STEP)
    k.c2s(body)
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}')
    k.fin()
p.close()
