# Short heads of many start lines ("GET \n" x 57, under the short-first-segment length, no
# head end) each followed by a SEG-byte segment that ends a head: the carried start lines are
# scanned again, each parsed at once (before the review fix each waited for its end, and the
# long segment was copied and scanned again for every one). TOTAL bytes on one connection
# that first carried a valid request. usage: g_refeed_chain.py OUT SEG TOTAL
import sys, os; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
out, SEG, TOTAL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = P(out); k = Conn(p, 1)
body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
k.c2s(b'POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
short = b'GET \n' * 57
long = b'x' * (SEG - 2) + b'\n\n'
for _ in range(max(1, TOTAL // SEG)):
    k.c2s(short)
    c2s_big(k, long)
p.close()
