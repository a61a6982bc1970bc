# One request per connection whose params are hostile JSON of about B bytes, answered with a
# result of the same shape; C connections. usage: g_json.py OUT B C shape
# shape: wide (object of many members), deep (nested arrays), deepobj (nested objects),
#        keys (many members with the same key), strs (one string of escapes), batchdeep
#        (a batch whose elements are deep)
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(9); out, B, C, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def val(B):
    if shape == 'wide':
        n = B // 10; return b'{' + b','.join(b'"k%06d":1' % i for i in range(n)) + b'}'
    if shape == 'keys':
        n = B // 6; return b'{' + b','.join([b'"k":1'] * n) + b'}'
    if shape == 'deep':
        n = B // 2; return b'[' * n + b']' * n
    if shape == 'deepobj':
        n = B // 7; return b'{"a":' * n + b'1' + b'}' * n
    if shape == 'strs':
        return b'"' + b'\\"' * (B // 2) + b'"'
    raise SystemExit('shape?')
p = P(out)
v = val(B)
for c in range(C):
    k = Conn(p, c)
    if shape == 'wide' or shape == 'keys' or shape == 'deepobj':
        params = b'{"name":"t","arguments":' + v + b',"_meta":' + v + b'}'
    else:
        params = b'{"name":"t","arguments":{"x":' + v + b'}}'
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + params + b'}'
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nMcp-Session-Id: s%d\r\nMcp-Method: tools/call\r\nMcp-Name: t\r\nContent-Length: %d\r\n\r\n' % (c, len(body)) + body, mss=60000)
    r = b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":' + v + b'}}'
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(r) + r, mss=60000)
    k.fin()
p.close()
