# Heads that span two segments and turn out broken in the second: the first segment is a
# valid request line and SEG bytes of header lines without the head's end, the second a line
# that is no header, then the end. Each broken head's carried bytes are scanned again for a
# message start (so that what follows is read as in one segment), once. TOTAL bytes of such
# pairs on one connection that first carried a valid request. usage: g_refeed.py OUT SEG TOTAL
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
out, SEG, TOTAL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = P(out); k = Conn(p, 1)
body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
k.c2s(b'POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
first = b'GET / HTTP/1.1\r\n' + b'a: b\r\n' * (SEG // 6)
for _ in range(max(1, TOTAL // SEG)):
    c2s_big(k, first)
    k.c2s(b'bad\r\n\r\n')
p.close()
