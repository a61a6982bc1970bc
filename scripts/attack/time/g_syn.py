# N connections opened by a SYN (and the server's SYN-ACK), each then carrying one small
# request head: many flows, past max_flows, evicted least recently seen.
# usage: g_syn.py OUT N
import sys, os, random; sys.path.insert(0, os.path.dirname(__file__)); from pc import *
random.seed(12); out, N = sys.argv[1], int(sys.argv[2])
p = P(out)
for c in range(N):
    C = (127, 1 + (c >> 24), (c >> 16) & 255, (c >> 8) & 255); sp = 1024 + (c & 255)
    cs = random.getrandbits(32); ss = random.getrandbits(32)
    p.rec(tcp(C, sp, S, 8080, cs, 0, 2)); p.rec(tcp(S, 8080, C, sp, ss, cs + 1, 18))
    p.rec(tcp(C, sp, S, 8080, cs + 1, ss + 1, 24, b'GET / HTTP/1.1\r\nHost: s\r\n'))
p.close()
