# Not a time scenario: a request behind a head broken in its first field, both in one segment
# (whole) or the broken head waiting across segments (split). Until 2026-12-07 the split
# one was lost (the carried bytes were dropped); both are read now. usage: g_carried_invalid.py OUT whole|split
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
out, split = sys.argv[1], sys.argv[2] == 'split'
p = P(out); k = Conn(p, 1)
body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
data = (b'GET / HTTP/1.1\r\nbad header\r\nPOST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\n'
        + b'Content-Length: %d\r\n\r\n' % len(body) + body)
cut = data.index(b'Content-Length')
if split:
    k.c2s(data[:cut]); k.c2s(data[cut:])
else:
    k.c2s(data)
k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{"jsonrpc":"2.0","id":1,"result":{}}')
p.close()
