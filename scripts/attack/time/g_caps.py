# initialize handshakes (each on a new session id) whose client and server capabilities are
# objects of about B bytes (shape: wide = many keys; deep = nested objects; dotted = keys
# with dots), repeated until TOTAL bytes. usage: g_caps.py OUT B TOTAL shape
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(13); out, B, TOTAL, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def caps(B):
    if shape == 'wide':
        return b'{' + b','.join(b'"k%07d":{}' % i for i in range(B // 13)) + b'}'
    if shape == 'deep':
        n = B // 7; return b'{"a":' * n + b'{}' + b'}' * n
    if shape == 'dotted':
        return b'{' + b','.join(b'"a.b.c.%07d":true' % i for i in range(B // 21)) + b'}'
    raise SystemExit('shape?')
c = caps(B)
p = P(out); k = Conn(p, 1)
for i in range(max(1, TOTAL // (2 * len(c)))):
    body = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":%s,"clientInfo":{"name":"c","version":"1"}}}' % c
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body, mss=60000)
    r = b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":%s,"serverInfo":{"name":"s","version":"1"}}}' % c
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s%d\r\nContent-Length: %d\r\n\r\n' % (i, len(r)) + r, mss=60000)
p.close()
