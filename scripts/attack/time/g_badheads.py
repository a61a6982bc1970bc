# HTTP heads whose request line is valid and whose first header line is not, packed into
# segments of SEG bytes with no empty line anywhere: each bad head is parsed, unfolded (which
# scans on to the end of the segment) and skipped by one byte. TOTAL bytes of such segments on
# one connection. SEG > 65000 uses TSO-style frames (IPv4 total length 0).
# usage: g_badheads.py OUT SEG TOTAL
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(3); out, SEG, TOTAL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = P(out); k = Conn(p, 1)
unit = b'GET / HTTP/1.1\r\nbad header\r\n'
seg = (unit * (SEG // len(unit) + 1))[:SEG]
for _ in range(max(1, TOTAL // SEG)):
    c2s_big(k, seg)
p.close()
