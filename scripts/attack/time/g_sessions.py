# Many sessions from one client, on one keep-alive connection: each an initialize answered
# with a fresh Mcp-Session-Id, then one tools/list on it. Past max_sessions (100,000) the
# least recently seen are evicted in batches. usage: g_sessions.py OUT S [caps]
# caps: number of capability keys each handshake declares (default 3)
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(6); out, S = sys.argv[1], int(sys.argv[2])
caps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
p = P(out); k = Conn(p, 1)
capobj = b'{' + b','.join(b'"c%d":{}' % i for i in range(caps)) + b'}'
def exch(req_hdrs, body, resp_hdrs, resp):
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n' + req_hdrs + b'Content-Length: %d\r\n\r\n' % len(body) + body, mss=60000)
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n' + resp_hdrs + b'Content-Length: %d\r\n\r\n' % len(resp) + resp, mss=60000)
for i in range(S):
    sid = b'sess-%08d' % i
    exch(b'', b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":%s,"clientInfo":{"name":"c","version":"1"}}}' % capobj,
         b'Mcp-Session-Id: ' + sid + b'\r\n',
         b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":%s,"serverInfo":{"name":"s","version":"1"}}}' % capobj)
    exch(b'Mcp-Session-Id: ' + sid + b'\r\n', b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}', b'', b'{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}')
p.close()
