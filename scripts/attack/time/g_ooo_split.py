# Reassembly: K one-byte out-of-order segments with one-byte holes between them, then one
# segment covering them all (R rounds on one connection, inside a huge request body).
# usage: g_ooo_split.py OUT K R
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(1); out, K, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = P(out); k = Conn(p, 1)
k.c2s(b'POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000000000\r\n\r\n')
for r in range(R):
    for i in range(K):
        k.c2s_at(1 + 2 * i, b'x')
    c2s_big(k, b'y' * (2 * K))  # one segment (TSO-style past 65,000 bytes)
p.close()
